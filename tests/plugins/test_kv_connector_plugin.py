"""The example KV connector package (examples/plugins/forkless-example-kv-connector),
installed for real, carries a prompt's KV from one offline engine to the next.

Each engine runs in its own process, one after the other, on one SQLite file: the second
loads the prompt blocks the first saved (``num_cached_tokens``) and its greedy output is
the same token for token.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import make_tiny_model, plugin_env

pytestmark = pytest.mark.slow  # each engine start is a few seconds

BLOCK = 16
MODULE = "forkless_example_kv_connector.connector"

# Runs one engine: argv-free, the request comes on stdin as JSON
# {"model", "kv_transfer_config", "batches": [[prompt token ids, ...], ...]}; each batch is
# one generate() call, in order, and "reset" is reset_prefix_cache(reset_connector=True).
# Prints, per batch, [[token ids, num_cached_tokens], ...] (for "reset", its result).
ENGINE = """
import json, sys
from forkless import LLM, SamplingParams

req = json.loads(sys.stdin.read())
kwargs = {"kv_transfer_config": req["kv_transfer_config"]} if req["kv_transfer_config"] else {}
try:
    llm = LLM(req["model"], max_model_len=1024, block_size=16, kv_cache_memory=16 << 20, **kwargs)
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
out = []
for batch in req["batches"]:
    if batch == "reset":
        out.append(llm.reset_prefix_cache(reset_connector=True))
        continue
    results = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    out.append([[list(r.outputs[0].token_ids), r.num_cached_tokens] for r in results])
llm.shutdown()
print(json.dumps({"batches": out}))
"""


def run_engine(model: Path, env: dict[str, str], kv_transfer_config: dict | None,
               batches: list[list[list[int]]]) -> dict:
    import subprocess
    import sys

    request = {"model": str(model), "kv_transfer_config": kv_transfer_config, "batches": batches}
    proc = subprocess.run([sys.executable, "-c", ENGINE], input=json.dumps(request), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sqlite_config(path: Path, **extra: object) -> dict:
    return {"kv_connector": "SQLiteConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"sqlite_path": str(path)}, **extra}


@pytest.fixture(scope="module")
def model(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with room for a 600-token prefix and more."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-1k"), smollm2_folder,
                           max_position_embeddings=1024)


# A 600-token prefix that three prompts share, and the prompts' own endings.
PREFIX = [(i * 7919) % 20000 + 100 for i in range(600)]
A = PREFIX + [311, 4242, 77, 1999, 5, 812, 64, 9000, 123, 4567, 88, 21]
C = PREFIX + [2718, 2818, 4590, 45, 2353, 6028, 7471, 352, 66]


def test_the_second_engine_loads_what_the_first_computed(model: Path, plugin_site: Path, tmp_path: Path) -> None:
    db = tmp_path / "store" / "kv.sqlite"  # the folder does not exist yet: it is created
    env = plugin_env(plugin_site, tmp_path)

    first = run_engine(model, env, sqlite_config(db), [[A]])["batches"]
    ((a_tokens, a_cached),) = first[0]
    assert a_cached == 0 and len(a_tokens) == 8
    with sqlite3.connect(db) as conn:  # the prompt's full blocks, the last one's too
        assert conn.execute("SELECT COUNT(*) FROM kv_blocks").fetchone()[0] == len(A) // BLOCK
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    # A new process, a new engine, the same file. C shares only the 600-token prefix with
    # A: it loads the prefix's full blocks and computes the rest. Then A loads all but
    # its last token (whose logits give the first output token).
    second = run_engine(model, env, sqlite_config(db), [[C], [A]])["batches"]
    ((c_tokens, c_cached),), ((a2_tokens, a2_cached),) = second
    assert c_cached == len(PREFIX) // BLOCK * BLOCK
    assert a2_cached == (len(A) - 1) // BLOCK * BLOCK
    assert a2_tokens == a_tokens

    # C's output over the loaded prefix is what an engine without a connector makes.
    ((plain_tokens, plain_cached),) = run_engine(model, env, None, [[C]])["batches"][0]
    assert plain_cached == 0
    assert c_tokens == plain_tokens


def test_reset_connector_empties_the_engines_blocks(model: Path, plugin_site: Path, tmp_path: Path) -> None:
    db = tmp_path / "kv.sqlite"
    env = plugin_env(plugin_site, tmp_path)
    with sqlite3.connect(db) as conn:  # another model's block in the same file
        conn.execute("CREATE TABLE kv_blocks (key TEXT PRIMARY KEY, data BLOB NOT NULL)")
        conn.execute("INSERT INTO kv_blocks VALUES ('0123456789abcdef-00', x'00')")
    batches = run_engine(model, env, sqlite_config(db), [[A], "reset", [A]])["batches"]
    ((a_tokens, a_cached),), reset, ((again_tokens, again_cached),) = batches
    assert a_cached == 0 and reset is True
    assert again_cached == 0 and again_tokens == a_tokens  # computed, not loaded
    with sqlite3.connect(db) as conn:  # saved again; the other model's block is still there
        assert conn.execute("SELECT COUNT(*) FROM kv_blocks").fetchone()[0] == len(A) // BLOCK + 1
    ((_, cached), ), reset = run_engine(model, env, sqlite_config(db), [[A], "reset"])["batches"]
    assert cached == (len(A) - 1) // BLOCK * BLOCK and reset is True
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT key FROM kv_blocks").fetchall() == [("0123456789abcdef-00",)]


def test_unknown_connector_lists_the_registered_ones(model: Path, plugin_site: Path, tmp_path: Path) -> None:
    error = run_engine(model, plugin_env(plugin_site, tmp_path), {"kv_connector": "SQLiteConector"}, [])["error"]
    assert error.startswith("ValueError: --kv-transfer-config: kv_connector 'SQLiteConector': unknown KV connector")
    assert "registered: ExampleConnector, RedisConnector, SQLiteConnector, SharedStorageConnector." in error


def test_missing_or_misspelt_sqlite_path_is_a_clear_error(model: Path, plugin_site: Path, tmp_path: Path) -> None:
    env = plugin_env(plugin_site, tmp_path)
    config = {"kv_connector": "SQLiteConnector", "kv_connector_extra_config": {}}
    error = run_engine(model, env, config, [])["error"]
    assert error == ("ValueError: --kv-transfer-config: SQLiteConnector needs kv_connector_extra_config.sqlite_path "
                     "(a database file, created if absent), got None")
    config["kv_connector_extra_config"] = {"sqlite_file": str(tmp_path / "kv.db")}
    error = run_engine(model, env, config, [])["error"]
    assert error == ("ValueError: --kv-transfer-config: SQLiteConnector: unknown kv_connector_extra_config key(s) "
                     "sqlite_file; known: sqlite_path")
    assert not (tmp_path / "kv.db").exists()


def test_module_path_loads_a_connector_nobody_registered(model: Path, plugin_site: Path, tmp_path: Path) -> None:
    db = tmp_path / "kv.sqlite"
    env = plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="")  # the package's plugin does not run
    error = run_engine(model, env, sqlite_config(db), [])["error"]
    assert ("unknown KV connector 'SQLiteConnector'; registered: ExampleConnector, RedisConnector, "
            "SharedStorageConnector.") in error

    config = sqlite_config(db, kv_connector_module_path=MODULE)
    ((tokens, cached),) = run_engine(model, env, config, [[A]])["batches"][0]
    assert cached == 0 and len(tokens) == 8
    with sqlite3.connect(db) as conn:  # the class from the module path saved the prompt
        assert conn.execute("SELECT COUNT(*) FROM kv_blocks").fetchone()[0] == len(A) // BLOCK
