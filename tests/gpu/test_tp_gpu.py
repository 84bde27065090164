"""Tensor and pipeline parallelism on CUDA: with one GPU (``-tp 1``) the path is the one
before it -- no process group, no NCCL communicator, full-size layers, decode CUDA graphs;
with two GPUs (skipped on a machine with fewer), ``-tp 2`` over NCCL gives ``-tp 1``'s
greedy tokens with CUDA graphs and async scheduling on, and ``-pp 2`` (stages over NCCL
send / recv) gives them too."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

PROMPTS = [{"prompt_token_ids": [100 + 37 * i + j for j in range(5 + 9 * i)]} for i in range(6)]


def _greedy(model, **engine_args):
    from forkless import LLM, SamplingParams

    llm = LLM(str(model), dtype="float32", max_model_len=256, kv_cache_memory=1 << 30, max_num_seqs=8,
              **engine_args)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        return llm, [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    except BaseException:
        llm.shutdown()
        raise


def test_tp1_on_cuda_makes_no_group_no_communicator_and_full_layers(real_size_model) -> None:
    import torch.distributed as dist
    from torch import nn

    from forkless.distributed.parallel_state import get_tp_group, model_parallel_is_initialized

    llm, tokens = _greedy(real_size_model)  # uni: the worker runs in this process
    try:
        assert len(tokens) == len(PROMPTS) and all(len(t) == 24 for t in tokens)
        assert not dist.is_initialized() and not model_parallel_is_initialized()
        assert get_tp_group().world_size == 1 and get_tp_group().communicator is None
        runner = llm.llm_engine.engine_core.executor.worker.model_runner
        model = runner.model
        assert type(model.model.embed_tokens) is nn.Embedding
        assert model.tp_group is None and all(layer.tp_group is None for layer in model.model.layers)
        assert model.model.embed_tokens.num_embeddings == model.config.vocab_size
        assert runner.kv_spec.num_kv_heads == model.config.num_key_value_heads
        assert runner.graphs is not None  # decode CUDA graphs, as before
    finally:
        llm.shutdown()


def test_nccl_communicator_is_the_cuda_platforms() -> None:
    from forkless.distributed import resolve_device_communicator
    from forkless.distributed.nccl import NcclCommunicator
    from forkless.platforms import current_platform

    assert current_platform.device_type == "cuda"
    assert resolve_device_communicator(current_platform.get_device_communicator_cls(),
                                       current_platform.dist_backend) is NcclCommunicator


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="-tp 2 needs two GPUs")
def test_tp2_over_nccl_matches_tp1_with_graphs_and_async(real_size_model) -> None:
    llm, one = _greedy(real_size_model)
    llm.shutdown()
    llm, two = _greedy(real_size_model, tensor_parallel_size=2, async_scheduling=True)
    llm.shutdown()
    assert two == one


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="-pp 2 needs two GPUs")
def test_pp2_over_nccl_matches_tp1(real_size_model) -> None:
    llm, one = _greedy(real_size_model)
    llm.shutdown()
    llm, two = _greedy(real_size_model, pipeline_parallel_size=2)
    llm.shutdown()
    assert two == one
