"""``--kv-cache-dtype``: the flag, its errors, the fp8 cache of the torch reference backend,
and what it does to the KV budget (CPU only; the Triton kernels are in tests/gpu)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from forkless.attention import AttentionMetadata, get_attention_backend
from forkless.config import EngineArgs
from tests.engine.tiny_models import make_model
from tests.models.test_torch_attention import BS, D, HKV, HQ, NUM_BLOCKS, naive


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("kv-dtype-llama"))


def test_flag_parses_vllm_values() -> None:
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser(), model_positional=False)
    for value in ("auto", "fp8", "fp8_e4m3"):
        assert EngineArgs.from_cli_args(parser.parse_args(["--kv-cache-dtype", value])).kv_cache_dtype == value
    assert EngineArgs.from_cli_args(parser.parse_args([])).kv_cache_dtype == "auto"


def test_unknown_value_is_a_clear_error(capsys: pytest.CaptureFixture[str], llama_dir: Path) -> None:
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser(), model_positional=False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int4"])
    err = capsys.readouterr().err
    assert "--kv-cache-dtype" in err and "'int4'" in err and "fp8_e4m3" in err
    # The Python API (LLM(**kwargs)) says the same.
    with pytest.raises(ValueError, match=r"--kv-cache-dtype='fp8_e5m2' is invalid: expected one of auto, fp8, fp8_e4m3"):
        EngineArgs(model=str(llama_dir), kv_cache_dtype="fp8_e5m2").create_engine_config()


def test_cache_dtype_reaches_the_cache_config(llama_dir: Path) -> None:
    config = EngineArgs(model=str(llama_dir), kv_cache_dtype="fp8").create_engine_config()
    assert config.cache_config.cache_dtype == "fp8"


def _stored_fp8(cache: torch.Tensor, kv: int, slots: list[int]) -> torch.Tensor:
    return cache[kv].view(-1, HKV, D).view(torch.uint8)[slots].view(torch.float8_e4m3fn)


def test_reference_fp8_cache_stores_e4m3_and_attends_over_it() -> None:
    """The torch reference with an fp8 cache: stored bytes are e4m3(x / scale), and every
    kind of step (prefill, prefill over context, mixed, decode, padding rows) attends as a
    naive attention over the keys/values rounded that way."""
    backend = get_attention_backend("torch")(HQ, HKV, D, D**-0.5)
    backend.k_scale, backend.v_scale = 0.5, 2.0
    cache = torch.zeros(backend.get_kv_cache_shape(NUM_BLOCKS, BS, HKV, D), dtype=torch.float8_e4m3fn)
    gen = torch.Generator().manual_seed(1)
    history: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    tables: dict[str, list[int]] = {}
    free = list(range(NUM_BLOCKS))
    steps = [[("a", 9), ("b", 3)], [("a", 1), ("b", 1)], [("a", 5), ("b", 1), ("c", 7)], [("a", 1), ("c", 1)]]

    def rounded(x: torch.Tensor, scale: float) -> torch.Tensor:
        return (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale

    for batch in steps:
        t = sum(n for _, n in batch)
        pad = 2
        q, k, v = (torch.randn(t + pad, h, D, generator=gen) * 3 for h in (HQ, HKV, HKV))
        k[0, 0, 0] = 1000.0  # beyond e4m3's range once divided by 0.5: saturates at 448
        slots, starts, lens, expected, row = [], [0], [], [], 0
        for seq, n in batch:
            old_k, old_v = history.get(seq, (k[:0], v[:0]))
            table = tables.setdefault(seq, [])
            for pos in range(old_k.shape[0], old_k.shape[0] + n):
                if pos // BS >= len(table):
                    table.append(free.pop())
                slots.append(table[pos // BS] * BS + pos % BS)
            full_k = torch.cat([old_k, rounded(k[row:row + n], 0.5)])
            full_v = torch.cat([old_v, rounded(v[row:row + n], 2.0)])
            history[seq] = (full_k, full_v)
            expected.append(naive(q[row:row + n], full_k, full_v, D**-0.5))
            row += n
            starts.append(row)
            lens.append(full_k.shape[0])
        width = max(len(tables[s]) for s, _ in batch)
        md = AttentionMetadata(
            slot_mapping=torch.tensor(slots + [-1] * pad),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32),
            block_tables=torch.tensor([tables[s] + [0] * (width - len(tables[s])) for s, _ in batch],
                                      dtype=torch.int32),
            max_query_len=max(n for _, n in batch), max_seq_len=max(lens), block_size=BS,
        )
        out = backend.forward(q, k, v, cache, md)
        torch.testing.assert_close(out[:t], torch.cat(expected), atol=1e-4, rtol=1e-4)
        stored_k = _stored_fp8(cache, 0, slots).float() * 0.5
        stored_v = _stored_fp8(cache, 1, slots).float() * 2.0
        assert torch.equal(stored_k, rounded(k[:t], 0.5))
        assert torch.equal(stored_v, rounded(v[:t], 2.0))
    assert _stored_fp8(cache, 0, [tables["a"][0] * BS]).float().max() == 448.0  # saturated, not NaN


def test_fp8_reference_is_close_to_the_model_dtype_cache() -> None:
    """fp8 rounding alone costs little accuracy: same inputs, float32 cache against fp8
    cache, relative error of the attention output under 5 %."""
    outs = []
    for dtype in (torch.float32, torch.float8_e4m3fn):
        backend = get_attention_backend("torch")(HQ, HKV, D, D**-0.5)
        cache = torch.zeros(backend.get_kv_cache_shape(NUM_BLOCKS, BS, HKV, D), dtype=dtype)
        gen = torch.Generator().manual_seed(3)
        n = 40
        q, k, v = (torch.randn(n, h, D, generator=gen) for h in (HQ, HKV, HKV))
        table = list(range(-(-n // BS)))
        md = AttentionMetadata(
            slot_mapping=torch.arange(n), query_start_loc=torch.tensor([0, n], dtype=torch.int32),
            seq_lens=torch.tensor([n], dtype=torch.int32), block_tables=torch.tensor([table], dtype=torch.int32),
            max_query_len=n, max_seq_len=n, block_size=BS,
        )
        outs.append(backend.forward(q, k, v, cache, md))
    err = ((outs[1] - outs[0]).norm() / outs[0].norm()).item()
    assert 0 < err < 0.05, err


def test_cpu_backend_refuses_fp8_naming_the_flag(llama_dir: Path) -> None:
    from forkless import LLM

    with pytest.raises(Exception, match=r"--kv-cache-dtype fp8 is not supported by the 'cpu' attention backend"
                                        r".*supports: auto.*--attention-backend torch"):
        LLM(str(llama_dir), kv_cache_dtype="fp8", attention_backend="cpu")


def test_fp8_cache_holds_twice_the_blocks_and_generates(llama_dir: Path) -> None:
    """With the same KV budget an fp8 cache holds twice the blocks (1 byte per element),
    and greedy generation through the torch reference runs end to end."""
    from forkless import LLM, SamplingParams

    blocks, texts = {}, {}
    for kv_dtype in ("auto", "fp8"):
        llm = LLM(str(llama_dir), kv_cache_dtype=kv_dtype, attention_backend="torch", dtype="bfloat16",
                  kv_cache_memory=4 << 20, max_model_len=128, max_num_seqs=4)
        try:
            blocks[kv_dtype] = llm.llm_engine.config.cache_config.num_blocks
            out = llm.generate(["The quick brown fox", "Paris is"],
                               SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
            texts[kv_dtype] = [o.outputs[0].token_ids for o in out]
        finally:
            llm.shutdown()
    assert blocks["fp8"] == 2 * blocks["auto"]
    assert all(len(ids) == 12 for ids in texts["fp8"])


def test_fp8_kv_cache_halves_the_kv_reads_but_not_the_weights() -> None:
    from forkless.bench.floor import kv_dtype_bytes, shape_from_config, throughput_floor
    from forkless.bench.shapes import SHAPES

    bf16 = shape_from_config(SHAPES["qwen3-0.6b"], num_params=600_000_000, dtype_bytes=2)
    fp8 = shape_from_config(SHAPES["qwen3-0.6b"], num_params=600_000_000, dtype_bytes=2,
                            kv_dtype_bytes=kv_dtype_bytes("fp8", 2))
    assert fp8.kv_bytes_per_token == 56 * 1024
    assert fp8.weight_bytes_per_step == bf16.weight_bytes_per_step
    work = [(100, 50), (300, 20)]
    a, b = (throughput_floor(s, work, max_num_seqs=4, bandwidth=1e12, peak_flops=1e15) for s in (bf16, fp8))
    assert b.kv_bytes * 2 == a.kv_bytes and b.weight_bytes == a.weight_bytes
    assert kv_dtype_bytes("auto", 2) == 2 and kv_dtype_bytes("fp8_e4m3", 2) == 1
    with pytest.raises(ValueError, match="--kv-cache-dtype='int8' is invalid"):
        kv_dtype_bytes("int8", 2)

