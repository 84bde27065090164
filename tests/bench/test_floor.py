"""The throughput floor (``forkless.bench.floor``): hand-computed numbers, and the CLI prints it."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkless.bench.floor import ModelShape, decode_steps, shape_from_config, throughput_floor
from forkless.bench.shapes import SHAPES
from tests.conftest import plugin_env, run_forkless

SMALL = ModelShape(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64, vocab_size=1000,
                   num_params=100_000, tied_embeddings=True, dtype_bytes=4)


def test_kv_bytes_per_token_of_qwen3_0_6b_is_112_kib() -> None:
    # 28 layers x 2 (K, V) x 8 KV heads x 128 x 2 bytes (bf16)
    shape = shape_from_config(SHAPES["qwen3-0.6b"], num_params=0, dtype_bytes=2)
    assert shape.kv_bytes_per_token == 28 * 2 * 8 * 128 * 2 == 112 * 1024


def test_decode_steps_of_the_continuous_batch() -> None:
    assert decode_steps([5, 3, 1], max_num_seqs=8) == 4  # all fit: the longest output - 1
    assert decode_steps([5, 3, 1], max_num_seqs=1) == 4 + 2 + 0  # one slot: one after another
    # 2 slots: A runs 0-4 (5 tokens), B runs 0-2 (3 tokens), then the third 2-2 (1 token).
    assert decode_steps([5, 3, 1], max_num_seqs=2) == 4
    assert decode_steps([3, 3, 3], max_num_seqs=2) == 4  # A 0-2, B 0-2, then 2-4


def test_floor_of_a_small_workload_matches_the_hand_computation() -> None:
    work = [(10, 5), (20, 3), (5, 1)]  # (input, output) tokens
    fl = throughput_floor(SMALL, work, max_num_seqs=2, bandwidth=1e6, peak_flops=1e6)
    # KV bytes per token: 2 layers x 2 x 2 KV heads x 16 x 4 bytes = 512.
    assert SMALL.kv_bytes_per_token == 512
    # Decode contexts: request 1 has 4 decode steps over 11, 12, 13, 14 tokens = 50;
    # request 2 has 2 over 21, 22 = 43; request 3 none. 93 tokens x 512 B = 47,616 B.
    assert fl.kv_bytes == 93 * 512 == 47_616
    # Weights per step: 100,000 params - the tied 1000 x 64 embedding = 36,000 matmul
    # params, + the 64,000 LM head = 100,000 params x 4 B = 400,000 B; 4 decode steps.
    assert fl.decode_steps == 4
    assert fl.weight_bytes == 4 * 400_000 == 1_600_000
    # Prefill: 2 x 36,000 x 35 prompt tokens = 2,520,000; LM head on each prompt's last
    # position: 2 x 1000 x 64 x 3 = 384,000; attention: 2 x 2 layers x 4 heads x 16 x
    # (10x11 + 20x21 + 5x6 = 560) = 143,360. Total 3,047,360 FLOPs.
    assert fl.prefill_flops == 2_520_000 + 384_000 + 143_360 == 3_047_360
    # At 1 MB/s and 1 MFLOP/s: 1.647616 s + 3.04736 s; 9 output tokens.
    assert fl.memory_seconds == pytest.approx(1.647616)
    assert fl.compute_seconds == pytest.approx(3.04736)
    assert fl.seconds == pytest.approx(4.694976)
    assert fl.tokens_per_s == pytest.approx(9 / 4.694976)
    # Decode FLOPs per step: 2 x (36,000 + 64,000) per running sequence + 4 x 2 layers x 4
    # heads x 16 = 512 per context token. Steps 0-3 run (2, 2, 1, 1) sequences over
    # (11 + 21, 12 + 22, 13, 14) tokens: 416,384 + 417,408 + 206,656 + 207,168.
    assert fl.decode_flops == 1_247_616
    # At 1 MFLOP/s no step takes longer to compute than to read (steps 0 and 1 tie).
    assert fl.decode_seconds == pytest.approx(fl.memory_seconds)
    # At 0.1 MFLOP/s every step is compute-bound: the floor counts each step's FLOPs instead.
    slow = throughput_floor(SMALL, work, max_num_seqs=2, bandwidth=1e6, peak_flops=1e5)
    assert slow.decode_seconds == pytest.approx(12.47616)
    assert slow.seconds == pytest.approx(12.47616 + 30.4736)
    assert slow.decode_compute_bound_share == pytest.approx(12.47616 / 1.647616 - 1)


def test_untied_models_read_the_lm_head_not_the_embedding() -> None:
    untied = ModelShape(**{**vars(SMALL), "num_params": 164_000, "tied_embeddings": False})
    assert untied.matmul_params == 36_000
    assert untied.weight_bytes_per_step == SMALL.weight_bytes_per_step == 400_000


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_bench_throughput_prints_the_floor_on_cpu(tiny_llama: Path, tmp_path: Path, kv_cache_dtype: str) -> None:
    # fp8 runs on the torch reference backend (the cpu backend refuses it); its KV
    # elements are 1 byte, so the floor's KV bytes are a quarter of float32's.
    extra = ["--kv-cache-dtype", "fp8", "--attention-backend", "torch"] if kv_cache_dtype == "fp8" else []
    out = run_forkless(["bench", "throughput", "--model", str(tiny_llama), "-n", "3", "--input-len", "8", "8",
                        "--output-len", "4", "4", "--skip-hf", "--max-num-seqs", "4", "--max-model-len", "64",
                        "--kv-cache-memory", str(16 << 20), "--json", str(tmp_path / "r.json"), *extra],
                       plugin_env(None, tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "CPU memory copy, measured now" in out.stdout
    assert "measured float32 matmul on the CPU" in out.stdout
    assert "(3 decode steps)" in out.stdout  # 3 requests fit: the 4-token output - 1
    assert "forkless / floor: " in out.stdout
    import json

    floor = json.loads((tmp_path / "r.json").read_text())["floor"]
    # tiny_llama: 2 layers x 2 x 2 KV heads x 16 head dim x 4 bytes (float32 on the CPU) = 512 B/token
    # (128 with 1-byte fp8 elements); each request reads 3 decode steps over 9, 10, 11 tokens = 30 tokens.
    assert floor["kv_bytes"] == 3 * 30 * (512 if kv_cache_dtype == "auto" else 128)
    assert floor["ratio"] > 0


def test_bench_throughput_runs_bench_serve_s_requests_with_its_flags(tiny_llama: Path, tmp_path: Path) -> None:
    # The server is compared with the offline engine on the same work: vLLM's random
    # dataset flags give `bench throughput` the requests `bench serve` sends (seed 0).
    import json

    from forkless.bench.serve import random_requests, vocab_size_of

    flags = ["--random-input-len", "12", "--random-output-len", "6", "--random-range-ratio", "0.5"]
    out = run_forkless(["bench", "throughput", "--model", str(tiny_llama), "-n", "4", *flags, "--skip-hf",
                        "--max-num-seqs", "4", "--max-model-len", "64", "--kv-cache-memory", str(16 << 20),
                        "--json", str(tmp_path / "r.json")], plugin_env(None, tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "random (bench serve's) input=12 output=6 range_ratio=0.5 seed=0" in out.stdout
    sent = random_requests(4, 12, 6, 0.5, vocab_size_of(str(tiny_llama)), 0)
    assert len({r.expected_output_len for r in sent}) > 1  # the lengths do vary
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["forkless"]["tokens"] == sum(r.expected_output_len for r in sent)
    # The floor's KV reads are those of these lengths: per request (o - 1) * i + (o - 1) * o / 2 tokens.
    kv_tokens = sum((o - 1) * r.prompt_len + (o - 1) * o // 2 for r in sent for o in [r.expected_output_len])
    assert result["floor"]["kv_bytes"] == kv_tokens * 512  # tiny_llama, float32: 512 B per token

    for bad, message in ((["--random-input-len", "12"], "--random-input-len and --random-output-len go together"),
                         ([*flags, "--input-len", "8", "8"], "give one pair"),
                         ([*flags[:4], "--random-range-ratio", "1.5"], "--random-range-ratio must be in [0, 1)"),
                         (["--random-input-len", "0", "--random-output-len", "4"],
                          "--random-input-len=0: expected an integer >= 1")):
        out = run_forkless(["bench", "throughput", "--model", str(tiny_llama), "-n", "2", "--skip-hf", *bad],
                           plugin_env(None, tmp_path), timeout=120)
        assert out.returncode != 0 and message in out.stderr, (bad, out.stderr[-2000:])


def test_vllm_cpu_benchmark_prints_the_floor_next_to_both(tiny_llama: Path, capsys: pytest.CaptureFixture) -> None:
    # benchmarks/vllm_cpu.py measures the machine and prints the workload's floor before the
    # engines run (the comparison itself needs vLLM's own venv, which CI does not build).
    import argparse
    import importlib.util

    script = Path(__file__).parents[2] / "benchmarks" / "vllm_cpu.py"
    spec = importlib.util.spec_from_file_location("vllm_cpu_bench", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    work = [([5] * 8, 4), ([6] * 12, 3)]
    fl = module.machine_floor(argparse.Namespace(threads=1, dtype="float32", max_num_seqs=4), str(tiny_llama), work)
    out = capsys.readouterr().out
    assert "CPU memory copy, 1 threads, measured now" in out and "best measured float32 matmul of torch and forkless, 1 threads" in out
    assert fl.decode_steps == 3 and fl.output_tokens == 7 and fl.seconds > 0
    # tiny_llama: 512 B of float32 KV a token; decode over 9, 10, 11 and 13, 14 tokens.
    assert fl.kv_bytes == (9 + 10 + 11 + 13 + 14) * 512
