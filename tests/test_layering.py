"""The house rules of the code layout, checked on the source (no imports run).

Each forkless package sits in one layer; a module may import from its own package and
from lower layers only (type-only imports included: they are dependencies too), so that
the arrows of ``docs/architecture.md`` stay true. Also: no import cycle between modules,
no ``FORKLESS_*`` variable read outside ``forkless/envs.py``, and no other package
reaching into ``forkless.plugins``' private modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "forkless"

# Lowest first; a package imports only itself and packages of strictly lower layers.
LAYERS: list[set[str]] = [
    {"forkless.version", "forkless.envs", "forkless.module_aliases", "forkless.utils", "forkless.exceptions"},
    {"forkless.logger", "forkless.gc_tuning", "forkless.json_arg", "forkless.triton_utils", "forkless.tracing"},
    {"forkless.plugins"},
    {"forkless.sampling_params", "forkless.pooling_params", "forkless.inputs"},
    {"forkless.protocol", "forkless.outputs", "forkless.tokenizers"},
    {"forkless.beam_search"},
    # Below structured outputs, whose grammars start after the reasoning.
    {"forkless.reasoning"},
    {"forkless.cpu_kernels", "forkless.tool_parsers",
     "forkless.metrics", "forkless.logits_processors", "forkless.structured_output", "forkless.io_processors"},
    {"forkless.attention", "forkless.sample", "forkless.core", "forkless.pooling", "forkless.distributed"},
    {"forkless.platforms"},
    {"forkless.ops"},
    {"forkless.models", "forkless.spec_decode", "forkless.kv_transfer"},
    {"forkless.model_loader"},
    {"forkless.lora"},
    {"forkless.config"},
    {"forkless.worker"},
    {"forkless.executor"},
    {"forkless.engine"},
    {"forkless.entrypoints", "forkless.entrypoints.llm", "forkless.entrypoints.openai",
     "forkless.entrypoints.chat_utils", "forkless.entrypoints.generate"},
    {"forkless.bench", "forkless.entrypoints.disagg_proxy"},
    {"forkless.entrypoints.cli"},
    # vLLM's import paths for ported plugins (most are aliases, forkless.module_aliases);
    # nothing imports them.
    {"forkless.v1", "forkless.logits_process", "forkless.model_executor"},
]
LAYER_OF = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """``forkless.x.y.z`` -> ``forkless.x`` (the unit the layers are made of), except that
    ``forkless.entrypoints`` is split into its parts (offline LLM, server, CLI)."""
    depth = 3 if module.startswith("forkless.entrypoints.") else 2
    return ".".join(module.split(".")[:depth])


def _in_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _is_submodule(name: str) -> bool:
    return (ROOT / f"{name}.py").exists() or (ROOT / name / "__init__.py").exists()


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(imported module, line, at module level)`` for every forkless import in a file.

    ``from forkless import envs`` counts as importing ``forkless.envs``.
    """
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    top = set(tree.body)
    out: list[tuple[str, int, bool]] = []
    for node in ast.walk(tree):
        at_top = node in top or (node in parents and parents[node] in top
                                 and isinstance(parents[node], (ast.Try, ast.If))
                                 and not _in_type_checking(node, parents))
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, at_top) for a in node.names if a.name.startswith("forkless")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("forkless"):
            if node.module == "forkless":
                # A submodule (``from forkless import envs``), or a lazy re-export of the
                # top package (``from forkless import LLM``).
                out += [(f"forkless.{a.name}" if _is_submodule(a.name) else "forkless",
                         node.lineno, at_top) for a in node.names]
            else:
                out.append((node.module, node.lineno, at_top))
    return out


def source_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py"))


def test_every_package_has_a_layer() -> None:
    packages = {package_of(module_name(p)) for p in source_files()} - {"forkless"}
    assert packages - set(LAYER_OF) == set(), "add new packages to LAYERS"


def test_imports_go_down_the_layers() -> None:
    wrong = []
    for path in source_files():
        me = package_of(module_name(path))
        if me == "forkless":
            continue  # the top package re-exports lazily; it sits above everything
        for target, line, _ in imports(path):
            other = package_of(target)
            if other == me:
                continue
            if other == "forkless" or LAYER_OF[other] >= LAYER_OF[me]:
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line}: {me} imports {target}")
    assert wrong == []


def test_no_import_cycle_between_modules() -> None:
    modules = {module_name(p): p for p in source_files()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for target, _, _ in imports(path):
            # ``import a.b.c`` runs a, a.b and a.b.c: the deepest existing module counts.
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != name and not name.startswith(target + "."):
                deps.add(target)
        graph[name] = deps
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [node, dep]) if dep in stack
                              else f"{node} -> {dep}")
            elif dep not in state:
                visit(dep, stack + [node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert cycles == []


def _reads_forkless_variable(node: ast.AST) -> bool:
    """``os.environ.get("FORKLESS_X")``, ``os.getenv(...)``, ``os.environ["FORKLESS_X"]``,
    ``"FORKLESS_X" in os.environ``."""
    if isinstance(node, ast.Call):
        where, keys = node.func, node.args[:1]
    elif isinstance(node, ast.Subscript):
        where, keys = node.value, [node.slice]
    elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
        where, keys = node.comparators[0], [node.left]
    else:
        return False
    text = ast.unparse(where)
    return ("environ" in text or "getenv" in text) and any(
        isinstance(k, ast.Constant) and str(k.value).startswith("FORKLESS_") for k in keys)


def test_environment_is_read_only_in_envs() -> None:
    wrong = []
    for path in source_files():
        if path.name == "envs.py" and path.parent == ROOT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _reads_forkless_variable(node):
                wrong.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert wrong == [], "read FORKLESS_* variables through forkless.envs"


def test_plugins_private_modules_stay_private() -> None:
    wrong = [f"{p.relative_to(ROOT.parent)}:{line}: {target}"
             for p in source_files() if package_of(module_name(p)) != "forkless.plugins"
             for target, line, _ in imports(p) if target.startswith("forkless.plugins._")]
    assert wrong == []
