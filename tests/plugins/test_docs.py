"""docs/plugins.md must stay true.

* Its quotes of the example packages still match the files.
* Every ``from forkless... import ...`` it shows imports, unless its line is marked
  *coming*; a coming one that imports fails ("documented as coming but exists").
* Every ``--flag`` exists in ``forkless serve`` (or, on a ``forkless plugins`` line, in
  that command), and every ``FORKLESS_*`` variable in ``forkless.envs``, unless coming.
* The group table matches ``forkless.plugins.GROUPS``; the tiers match the interfaces,
  whose abstract methods the guide names.
* Every example package is pip-installed (the shared ``plugin_site``), checked with
  ``forkless plugins check`` (the good ones pass, the bad ones fail as designed) and used
  once. Servers are not started here: tests/server/ runs the packages in a real server.

README.md, docs/architecture.md and docs/sampling.md get the cheap part: every ``--flag``
exists in a ``forkless`` command, every ``FORKLESS_*`` variable in ``forkless.envs``, every
file path in the repository, and every import and dotted ``forkless.…`` name resolves; the
tiers of docs/architecture.md's extension table match the interfaces.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import textwrap
import tomllib
from pathlib import Path

import pytest

from forkless.plugins import GROUPS
from tests.conftest import EXAMPLES, REPO, plugin_env, run_forkless, run_python

DOC = (REPO / "docs" / "plugins.md").read_text()
LINES = DOC.splitlines()

#: Example packages that fail ``forkless plugins check`` on purpose, and how.
DESIGNED_TO_FAIL = {
    "forkless-example-broken": "loading failed: ",
    "forkless-example-incompatible": "incompatible: ",
    "forkless-example-nonreentrant": "not re-entrant: ",
}
#: Example packages without an entry point (passed by path); each has a test below.
WITHOUT_ENTRY_POINTS = {"forkless-example-scheduler", "forkless-example-middleware"}


def is_coming(line: str) -> bool:
    return re.search(r"\bcoming\b", line, flags=re.I) is not None


def code_blocks() -> list[tuple[str, list[str]]]:
    """``(language, lines)`` of every fenced block."""
    blocks, current, lang = [], None, ""
    for line in LINES:
        if line.startswith("```"):
            if current is None:
                current, lang = [], line[3:].strip()
            else:
                blocks.append((lang, current))
                current = None
        elif current is not None:
            current.append(line)
    assert current is None, "unclosed code block"
    return blocks


def prose_lines() -> list[str]:
    """Lines outside fenced blocks."""
    out, inside = [], False
    for line in LINES:
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            out.append(line)
    return out


# -- quotes -----------------------------------------------------------------------------


def test_every_quoted_excerpt_matches_its_file() -> None:
    blocks = re.findall(r"```(?:python|toml)\n# (examples/\S+)\n(.*?)```", DOC, flags=re.S)
    assert len(blocks) >= 15
    for path, excerpt in blocks:
        source = (REPO / path).read_text()
        excerpt = excerpt.strip()
        if excerpt in source:
            continue
        # A non-contiguous quote: every line, in the file's order.
        cursor = 0
        for line in (ln for ln in excerpt.splitlines() if ln.strip()):
            found = source.find(line, cursor)
            assert found >= 0, f"docs/plugins.md quotes {path}, which no longer says (in this order):\n{line}"
            cursor = found + len(line)


def test_every_group_is_documented_and_every_linked_example_exists() -> None:
    for group in GROUPS:
        assert f"`{group}`" in DOC
    linked = set(re.findall(r"\(\.\./examples/plugins/([\w-]+)/\)", DOC))
    for name in linked:
        assert (EXAMPLES / name / "pyproject.toml").exists()
    on_disk = {p.name for p in EXAMPLES.iterdir() if (p / "pyproject.toml").exists()}
    assert on_disk <= linked, f"examples not described in docs/plugins.md: {on_disk - linked}"


# -- import paths, flags, variables -----------------------------------------------------

IMPORT = re.compile(r"^\s*from\s+(forkless(?:\.\w+)*)\s+import\s+(.+)$")


def _names(text: str) -> list[str]:
    return [n.split(" as ")[0].strip() for n in text.strip("() ").split(",") if n.strip()]


def documented_imports() -> list[tuple[str, list[str], bool]]:
    """``(module, names, coming)`` of every import in code blocks and inline code."""
    found: list[tuple[str, list[str], bool]] = []
    for lang, lines in code_blocks():
        if lang != "python":  # e.g. python -c "from forkless... import ...; ..." in a console
            for line in lines:
                for m in re.finditer(r"\bfrom\s+(forkless(?:\.\w+)*)\s+import\s+(\w+(?:\s*,\s*\w+)*)", line):
                    found.append((m[1], _names(m[2]), is_coming(line)))
            continue
        i = 0
        while i < len(lines):
            m = IMPORT.match(lines[i])
            if m:
                text, coming = m[2], is_coming(lines[i])
                while text.rstrip().endswith("(") or (text.count("(") > text.count(")")):
                    i += 1
                    text += " " + lines[i].strip()
                found.append((m[1], _names(text.split("#")[0]), coming))
            i += 1
    for line in prose_lines():
        for span in re.findall(r"`([^`]+)`", line):
            m = IMPORT.match(span)
            if m:
                found.append((m[1], _names(m[2]), is_coming(line)))
    # An import that the parsing above missed (split across lines in prose) is an error.
    assert len(found) == len(re.findall(r"\bfrom\s+forkless(?:\.\w+)*\s+import\b", DOC)), \
        "keep each documented import on one line (inline code cannot span lines here)"
    return found


PROBE = textwrap.dedent("""
    import importlib, json, sys
    request = json.loads(sys.stdin.read())
    out = {"imports": {}, "classes": {}}
    for module, names in request["imports"]:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            out["imports"][module] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out["imports"][module] = {n: hasattr(mod, n) for n in names}
    from forkless.plugins import tier_of
    for path in request["classes"]:
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        out["classes"][path] = {"tier": tier_of(cls).value,
                                "abstract": sorted(getattr(cls, "__abstractmethods__", ()))}
    print(json.dumps(out))
""")


def interface_rows() -> list[tuple[str, str, bool]]:
    """``(interface class path, tier, coming)`` from the extension-point table."""
    rows = []
    for line in LINES:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 6 and cells[4].strip("*") in ("public", "provisional", "internal"):
            m = re.fullmatch(r"`(forkless(?:\.\w+)+\.[A-Z]\w+)`", cells[2])
            if m:
                rows.append((m[1], cells[4].strip("*"), is_coming(line)))
    return rows


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Imports the documented paths and interfaces in a clean process (no plugins)."""
    import subprocess
    import sys

    modules: dict[str, list[str]] = {}
    for module, names, _ in documented_imports():
        modules.setdefault(module, [])
        modules[module] += [n for n in names if n not in modules[module]]
    request = {"imports": sorted(modules.items()), "classes": [p for p, _, _ in interface_rows()]}
    proc = subprocess.run([sys.executable, "-c", PROBE], input=json.dumps(request), capture_output=True,
                          text=True, env=plugin_env(None, tmp_path_factory.mktemp("probe")), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _exists(probe: dict, module: str, name: str) -> bool:
    result = probe["imports"][module]
    return "error" not in result and result[name]


def test_every_documented_import_exists_unless_coming(probe: dict) -> None:
    imports = documented_imports()
    assert len(imports) >= 20
    missing = [f"from {module} import {name}: "
               + probe["imports"][module].get("error", f"{module} has no attribute {name!r}")
               for module, names, coming in imports if not coming
               for name in names if not _exists(probe, module, name)]
    assert not missing, "documented in docs/plugins.md but missing (mark it coming?):\n" + "\n".join(missing)
    exists = [f"from {module} import {', '.join(names)}" for module, names, coming in imports
              if coming and all(_exists(probe, module, n) for n in names)]
    assert not exists, "documented as coming but exists: update the docs:\n" + "\n".join(exists)
    # The contract's paths are all in the guide (forkless.distributed was the last coming one).
    documented = {(m, n) for m, names, c in imports for n in names}
    for module, name in [("forkless.distributed", "DeviceCommunicatorBase"), ("forkless.ops", "CustomOp")]:
        assert (module, name) in documented, f"{module}.{name} should be in the guide"


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _options(parser: argparse.ArgumentParser) -> set[str]:
    options = {s for a in parser._actions for s in a.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options |= _options(sub)
    return options


@pytest.fixture(scope="module")
def cli_options() -> dict[str, set[str]]:
    from forkless.entrypoints.cli.main import build_parser

    return {cmd: _options(_subparser(build_parser([cmd]), cmd)) for cmd in ("serve", "plugins")}


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")


def _flags(text: str) -> list[str]:
    """The flags ``text`` names, in the dashed spelling (``--max_model_len`` is vLLM's
    spelling of ``--max-model-len``, which forkless takes too)."""
    return [flag.replace("_", "-") for flag in FLAG.findall(text)]
ENV = re.compile(r"\bFORKLESS_[A-Z][A-Z0-9_]*")


def test_every_documented_flag_exists_unless_coming(cli_options: dict[str, set[str]]) -> None:
    checked, missing = set(), []
    for line in LINES:
        command = "plugins" if "forkless plugins" in line else "serve"
        for flag in _flags(line):
            if is_coming(line):
                continue
            checked.add(flag)
            if flag not in cli_options[command]:
                missing.append(f"forkless {command} {flag}: {line.strip()}")
    assert not missing, "docs/plugins.md documents flags that do not exist (mark them coming?):\n" + "\n".join(missing)
    assert {"--scheduler-cls", "--attention-backend", "--middleware", "--distributed-executor-backend",
            "--logits-processors", "--reasoning-parser", "--json"} <= checked


def test_every_documented_variable_exists_unless_coming() -> None:
    from forkless.envs import environment_variables

    example_sources = "\n".join(p.read_text() for p in EXAMPLES.rglob("*.py") if "build" not in p.parts)
    missing = []
    for line in LINES:
        if is_coming(line):
            continue
        for name in ENV.findall(line):
            if name.startswith("FORKLESS_EXAMPLE_"):  # read by an example package, not forkless
                ok = name in example_sources
            else:
                ok = name in environment_variables
            if not ok:
                missing.append(f"{name}: {line.strip()}")
    assert not missing, "docs/plugins.md names variables nothing reads:\n" + "\n".join(missing)


def test_coming_lines_name_something_that_does_not_exist_yet(probe: dict, cli_options: dict[str, set[str]]) -> None:
    from forkless.envs import environment_variables
    from forkless.executor import available_executors

    imports = {(m, tuple(n)) for m, n, _ in documented_imports()}
    stale = []
    for line in LINES:
        if not is_coming(line):
            continue
        items = []  # (what, exists)
        for span in re.findall(r"`([^`]+)`", line):
            m = IMPORT.match(span)
            if m:
                names = _names(m[2])
                assert (m[1], tuple(names)) in imports
                items.append((span, all(_exists(probe, m[1], n) for n in names)))
            m = re.fullmatch(r"--distributed-executor-backend (\w+)", span)
            if m:
                items.append((span, m[1] in available_executors()))
        items += [(flag, flag in cli_options["serve"]) for flag in _flags(line)]
        items += [(name, name in environment_variables) for name in ENV.findall(line)]
        if items and all(exists for _, exists in items):
            stale.append(f"{', '.join(what for what, _ in items)}: {line.strip()}")
    assert not stale, "documented as coming but exists: update the docs:\n" + "\n".join(stale)


# -- tables and interfaces --------------------------------------------------------------


def test_group_table_matches_GROUPS() -> None:
    section = DOC[DOC.index("## 2. Entry-point groups"):DOC.index("## 3. Extension points")]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `forkless."):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            assert len(cells) == 5, line
            rows[cells[0].strip("`")] = cells
    assert set(rows) == set(GROUPS)
    for name, (_, _, loaded_in, default, status) in rows.items():
        spec = GROUPS[name]
        assert ("off" in default) == spec.opt_in, f"{name}: the table's default {default!r} vs opt_in={spec.opt_in}"
        assert default.startswith("on") or "FORKLESS_PLUGINS=+" in default, default
        assert loaded_in.startswith(spec.loaded_in), f"{name}: loaded in {loaded_in!r} vs {spec.loaded_in!r}"
        assert status == "available" or status.startswith("coming"), status


def test_tiers_match_and_abstract_methods_are_named(probe: dict) -> None:
    rows = interface_rows()
    assert len(rows) >= 9
    for path, tier, coming in rows:
        assert not coming
        info = probe["classes"][path]
        assert info["tier"] == tier, f"{path} is {info['tier']}, the table says {tier}"
        for method in info["abstract"]:
            assert f"{method}(" in DOC or f"`{method}`" in DOC, f"{path}.{method} is not described"
    for method in ("total_memory_bytes", "free_memory_bytes", "is_available"):  # Platform's
        assert f"{method}(" in DOC


# -- the example packages, installed and used -------------------------------------------


def entry_points_by_package() -> dict[str, dict[str, str]]:
    """``{distribution: {entry point name: group}}`` from every example's pyproject.toml."""
    out = {}
    for folder in sorted(EXAMPLES.iterdir()):
        if (folder / "pyproject.toml").exists():
            project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
            out[project["name"]] = {name: group for group, eps in project.get("entry-points", {}).items()
                                    for name in eps}
    return out


@pytest.fixture(scope="module")
def check_results(plugin_site: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """``forkless plugins check --json`` over every installed example plugin."""
    proc = run_forkless(["plugins", "check", "--json"], plugin_env(plugin_site, tmp_path_factory.mktemp("check")))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the broken examples fail
    return {r["name"]: r for r in json.loads(proc.stdout)}


def test_plugins_check_passes_the_good_examples_and_fails_the_bad_ones(check_results: dict[str, dict]) -> None:
    packages = entry_points_by_package()
    assert {p for p, eps in packages.items() if not eps} == WITHOUT_ENTRY_POINTS
    expected = {name: (package, group) for package, eps in packages.items() for name, group in eps.items()}
    # forkless's own plugins (the LoRA filesystem resolver), registered as a third party's are.
    own = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("entry-points", {})
    expected.update({name: ("forkless", group) for group, eps in own.items() if group.startswith("forkless.")
                     for name in eps})
    assert set(check_results) == set(expected)
    for name, result in check_results.items():
        package, group = expected[name]
        assert (result["group"], result.get("dist", package)) == (group, package)
        if package in DESIGNED_TO_FAIL:
            assert not result["ok"], name
            assert any(p.startswith(DESIGNED_TO_FAIL[package]) for p in result["problems"]), result["problems"]
        else:
            assert result["ok"], (name, result["problems"], result.get("traceback"))


def test_every_documented_check_command_names_a_plugin_and_says_how_it_ends(check_results: dict[str, dict]) -> None:
    commands = re.findall(r"^\$ forkless plugins check ([\w ]+)$", DOC, flags=re.M)
    named = {name for c in commands for name in c.split()}
    # Every example package that works has its check command in the guide.
    unchecked = [package for package, eps in entry_points_by_package().items()
                 if eps and package not in DESIGNED_TO_FAIL and not set(eps) & named]
    assert not unchecked, f"no `forkless plugins check NAME` in the guide for {unchecked}"
    for name in named:
        assert name in check_results, f"the guide checks {name!r}, which no example installs"
        shown = re.search(rf"^(ok  |FAIL) {name} \(", DOC, flags=re.M)
        if shown:  # a sample output in the guide
            assert (shown[1] == "ok  ") == check_results[name]["ok"], name


def runnable_blocks() -> list[tuple[str, list[str]]]:
    """``(code, expected lines)`` of the python blocks with ``# prints:`` lines."""
    out = []
    for lang, lines in code_blocks():
        if lang == "python" and any(ln.startswith("# prints: ") for ln in lines):
            out.append(("\n".join(lines), [ln[len("# prints: "):] for ln in lines if ln.startswith("# prints: ")]))
    return out


FAST_BLOCKS = [b for b in runnable_blocks() if not b[0].startswith("# try_plugins.py")]


@pytest.mark.parametrize("code, expected", FAST_BLOCKS, ids=[e[-1].split()[-1].strip("<>'") for _, e in FAST_BLOCKS])
def test_python_block_prints_what_the_guide_says(code: str, expected: list[str], plugin_site: Path,
                                                 tmp_path: Path) -> None:
    proc = run_python(code, plugin_env(plugin_site, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == expected


def test_console_python_commands_print_what_the_guide_says(plugin_site: Path, tmp_path: Path) -> None:
    ran = 0
    for lang, lines in code_blocks():
        if lang != "console":
            continue
        for command, output in zip(lines, lines[1:] + [""]):
            if not re.match(r"\$ (?:[A-Z_]+=\S* )*python -c ", command):
                continue
            words = shlex.split(command[2:])
            env = {}
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
                key, value = words.pop(0).split("=", 1)
                env[key] = value
            if words[:2] != ["python", "-c"] or output.startswith("$"):
                continue
            proc = run_python(words[2], plugin_env(plugin_site, tmp_path, **env))
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout.strip() == output, command
            ran += 1
    assert ran >= 1  # the platform check


ATTENTION_VS_REFERENCE = """
import torch
from forkless.attention import AttentionMetadata, get_attention_backend
from forkless.plugins import load_general_plugins

load_general_plugins()
torch.manual_seed(0)
HQ, HKV, D, BS, NB = 4, 2, 8, 4, 16
classes = [get_attention_backend("naive"), get_attention_backend("torch")]
layers = [cls(HQ, HKV, D, D ** -0.5) for cls in classes]
caches = [torch.zeros(cls.get_kv_cache_shape(NB, BS, HKV, D)) for cls in classes]
tables = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32)

def step(q_lens, seq_lens, with_cache=True):
    slots = [int(tables[i, p // BS]) * BS + p % BS
             for i, (q, s) in enumerate(zip(q_lens, seq_lens)) for p in range(s - q, s)]
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    md = dict(slot_mapping=torch.tensor(slots), query_start_loc=starts,
              seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_tables=tables,
              max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_size=BS)
    rows = sum(q_lens)
    q, k, v = torch.randn(rows, HQ, D), torch.randn(rows, HKV, D), torch.randn(rows, HKV, D)
    outs = [layer.forward(q, k, v, cache if with_cache else None, AttentionMetadata(**md))
            for layer, cache in zip(layers, caches)]
    torch.testing.assert_close(outs[0], outs[1])

step([5, 3], [5, 3], with_cache=False)  # the profiling run: no cache
step([5, 3], [5, 3])  # prefill
step([1, 1], [6, 4])  # decode
step([3, 1], [9, 5])  # a prompt chunk on top of cached context, and a decode
print("same as the reference")
"""


def test_attention_backend_matches_the_reference_backend(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_python(ATTENTION_VS_REFERENCE, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="example_attention"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "same as the reference"


SCHEDULER = """
from forkless.core.request import Request
from forkless.core.sched import KVCacheConfig, SchedulerConfig, get_scheduler_cls
from forkless.sampling_params import SamplingParams

cls = get_scheduler_cls("forkless_example_scheduler:ShortPromptScheduler")
scheduler = cls(SchedulerConfig(max_model_len=1024), KVCacheConfig(num_blocks=128, block_size=16))
try:
    scheduler.add_request(Request("long", range(300), SamplingParams()))
except ValueError as exc:
    print(exc)
scheduler.add_request(Request("short", range(10), SamplingParams()))
print(scheduler.schedule().num_batched_tokens)
"""


def test_scheduler_class_refuses_long_prompts(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_python(SCHEDULER, plugin_env(plugin_site, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["request 'long': the prompt has 300 tokens; this server accepts at most 256",
                                        "10"]


REASONING = """
import json
from forkless.plugins import load_general_plugins
from forkless.reasoning import ReasoningParserManager

class Tokenizer:  # what is_reasoning_end needs of a tokenizer
    def decode(self, ids):
        return "".join(map(chr, ids))

load_general_plugins()
cls = ReasoningParserManager.get_reasoning_parser("thought_tag")
out = []
for text in ["<thought>a</thought>b", "<thought>x</tho", "<thou", "plain", "<thought>r</thought>"]:
    whole = cls(Tokenizer()).extract_reasoning_content(text, request=None)
    parser, reasoning, content = cls(Tokenizer()), "", ""
    for n in range(1, len(text) + 1):  # one character per step
        delta = parser.extract_reasoning_content_streaming(text[:n - 1], text[:n], text[n - 1],
                                                           [], [], [])
        if delta is not None:
            reasoning += delta.reasoning_content or ""
            content += delta.content or ""
    ends = cls(Tokenizer()).is_reasoning_end([ord(c) for c in text])
    out.append([list(whole), reasoning or None, content or None, ends])
print(json.dumps(out))
"""


def test_reasoning_parser_splits_whole_and_streamed_output_alike(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_python(REASONING, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="example_reasoning_parser"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [
        [["a", "b"], "a", "b", True],
        [["x</tho", None], "x", None, False],  # an unfinished tag is held back while streaming
        [[None, "<thou"], None, None, False],
        [[None, "plain"], None, "plain", False],
        [["r", None], "r", None, True],
    ]


MIDDLEWARE = """
from fastapi import FastAPI
from fastapi.testclient import TestClient
from forkless.entrypoints.openai.api_server import resolve_middleware

app = FastAPI()
app.get("/health")(lambda: {})
app.middleware("http")(resolve_middleware("forkless_example_middleware:add_process_time"))
print(float(TestClient(app).get("/health").headers["x-process-time-ms"]) >= 0)
"""


def test_middleware_adds_its_header(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_python(MIDDLEWARE, plugin_env(plugin_site, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


# -- the other documents: README.md, docs/architecture.md, docs/sampling.md -------------

OTHER_DOCS = ["README.md", "docs/architecture.md", "docs/sampling.md"]
#: Flags on lines that are not forkless's: Ray's own command line, and the placeholder of
#: an error line.
NOT_FORKLESS_FLAGS = {"--head", "--address", "--num-cpus", "--flag"}


@pytest.fixture(scope="module")
def every_cli_option() -> set[str]:
    """The options of every ``forkless`` command and of ``python -m forkless.metrics.step_trace``."""
    from forkless.entrypoints.cli.main import build_parser

    options: set[str] = set()
    for command in ("serve", "generate", "plugins", "bench", "disagg-proxy"):
        options |= _options(_subparser(build_parser([command]), command))
    step_trace = (REPO / "forkless" / "metrics" / "step_trace.py").read_text()
    return options | {flag for flag in _flags(step_trace) if f'"{flag}"' in step_trace}


@pytest.mark.parametrize("doc", OTHER_DOCS)
def test_other_documents_name_only_existing_flags_variables_and_files(doc: str,
                                                                      every_cli_option: set[str]) -> None:
    from forkless.envs import environment_variables

    text = (REPO / doc).read_text()
    missing = []
    for number, line in enumerate(text.splitlines(), 1):
        if is_coming(line):
            continue
        missing += [f"{doc}:{number}: flag {flag}" for flag in _flags(line)
                    if flag not in every_cli_option and flag not in NOT_FORKLESS_FLAGS]
        missing += [f"{doc}:{number}: variable {name}" for name in ENV.findall(line)
                    if name not in environment_variables]
    base = (REPO / doc).parent
    for path in set(re.findall(r"(?<![\w/.])((?:\.\./)?(?:forkless|tests|benchmarks|examples|docs)/[\w/.-]*\w/?)",
                               text)):
        if not ((REPO / path).exists() or (base / path).exists()):
            missing.append(f"{doc}: file {path}")
    assert not missing, f"{doc} names what does not exist (mark it coming?):\n" + "\n".join(missing)


DOTTED_PROBE = textwrap.dedent("""
    import importlib, json, sys
    out = {}
    for path in json.loads(sys.stdin.read()):
        parts = path.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for name in parts[i:]:
                obj = getattr(obj, name, out)
                if obj is out:
                    break
            break
        out[path] = obj is not out
    print(json.dumps(out))
""")


@pytest.mark.parametrize("doc", OTHER_DOCS)
def test_other_documents_name_only_importable_python(doc: str, tmp_path: Path) -> None:
    """Every ``from forkless... import ...`` and every dotted ``forkless.…`` name (a module, or
    a name in one) resolves, entry-point groups aside."""
    text = (REPO / doc).read_text()
    names = set()
    for m in re.finditer(r"\bfrom\s+(forkless(?:\.\w+)*)\s+import\s+(\w+(?:\s*,\s*\w+)*)", text):
        names |= {f"{m[1]}.{name}" for name in _names(m[2])}
    names |= {n for n in re.findall(r"`(forkless(?:\.\w+)+)", text) if n not in GROUPS}
    if not names:
        return
    proc = run_python(DOTTED_PROBE.replace("sys.stdin.read()", repr(json.dumps(sorted(names)))),
                      plugin_env(None, tmp_path))
    assert proc.returncode == 0, proc.stderr
    missing = [name for name, ok in json.loads(proc.stdout.splitlines()[-1]).items() if not ok]
    assert not missing, f"{doc} names Python that does not exist:\n" + "\n".join(missing)


ARCHITECTURE_TIERS = textwrap.dedent("""
    import importlib, json, sys
    from forkless.plugins import tier_of
    out = {}
    for folder, name in json.loads(sys.argv[1]):
        module = importlib.import_module(folder)
        cls = getattr(module, name, None) or getattr(importlib.import_module(folder + ".interface"), name)
        out[name] = tier_of(cls).value
    print(json.dumps(out))
""")


def test_architecture_extension_table_tiers_match_the_interfaces(tmp_path: Path) -> None:
    rows = []  # (folder as a module, interface class, tier)
    for line in (REPO / "docs" / "architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 6 and cells[1].startswith("`forkless/"):
            folder = cells[1].strip("`/").replace("/", ".")
            rows += [(folder, name, cells[5]) for name in re.findall(r"`([A-Z]\w+)`", cells[2])]
    assert len(rows) >= 16
    code = ARCHITECTURE_TIERS.replace("sys.argv[1]", repr(json.dumps([(f, n) for f, n, _ in rows])))
    proc = run_python(code, plugin_env(None, tmp_path))
    assert proc.returncode == 0, proc.stderr
    tiers = json.loads(proc.stdout.splitlines()[-1])
    wrong = [f"{name}: the table says {tier}, the class is {tiers[name]}" for _, name, tier in rows if tiers[name] != tier]
    assert not wrong, "docs/architecture.md §4:\n" + "\n".join(wrong)
