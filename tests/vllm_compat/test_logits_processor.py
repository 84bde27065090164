"""A vLLM v1 logits processor, imports renamed only, runs in forkless offline and served."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from forkless import LLM, SamplingParams
from forkless.logits_processors import LogitsProcessor

PATH = "tests.vllm_compat.vllm_style_logits_processor:TargetTokenLogitsProcessor"


def test_offline_llm_takes_the_class_and_forces_only_the_asking_requests(tiny_llama: Path) -> None:
    from tests.vllm_compat.vllm_style_logits_processor import TargetTokenLogitsProcessor

    llm = LLM(model=str(tiny_llama), max_model_len=128, logits_processors=[TargetTokenLogitsProcessor])
    try:
        forced, free = llm.generate(
            ["Hello", "Hello"],
            [SamplingParams(max_tokens=6, ignore_eos=True, extra_args={"target_token": 42}),
             SamplingParams(max_tokens=6, ignore_eos=True)], use_tqdm=False)
    finally:
        llm.shutdown()
    assert forced.outputs[0].token_ids == [42] * 6
    assert free.outputs[0].token_ids != [42] * 6


def test_validate_params_rejects_a_bad_argument_before_generation(tiny_llama: Path) -> None:
    llm = LLM(model=str(tiny_llama), max_model_len=128, logits_processors=[PATH])
    try:
        with pytest.raises(ValueError, match="target_token value x is not int"):
            llm.generate(["Hello"], SamplingParams(max_tokens=2, extra_args={"target_token": "x"}),
                         use_tqdm=False)
    finally:
        llm.shutdown()


def test_the_adapter_runs_each_requests_function_and_leaves_the_others(tiny_llama: Path) -> None:
    # vLLM's AdapterLogitsProcessor: a function per request that asks, with two or three
    # parameters (the three-parameter form also gets the prompt); the live output list.
    from tests.vllm_compat.vllm_style_logits_processor import PerRequestLogitsProcessor

    llm = LLM(model=str(tiny_llama), max_model_len=128, logits_processors=[PerRequestLogitsProcessor])
    try:
        tokenizer = llm.get_tokenizer()
        prompt = "Hello there"
        prompt_ids = tokenizer.encode(prompt)
        free_alone = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), use_tqdm=False)
        forced, echoed, free = llm.generate(
            [prompt] * 3,
            [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, extra_args={"force_token": 42}),
             SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, extra_args={"echo_prompt": True}),
             SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)], use_tqdm=False)
    finally:
        llm.shutdown()
    assert forced.outputs[0].token_ids == [42] * 6
    assert echoed.outputs[0].token_ids == [prompt_ids[i % len(prompt_ids)] for i in range(6)]
    assert free.outputs[0].token_ids == free_alone[0].outputs[0].token_ids


class _Raising(LogitsProcessor):
    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        pass

    def apply(self, logits):
        raise ValueError("too many dimensions 'str'")


def test_a_processor_that_raises_is_named_in_the_error(tiny_llama: Path) -> None:
    llm = LLM(model=str(tiny_llama), max_model_len=128, logits_processors=[_Raising])
    try:
        with pytest.raises(Exception, match=r"logits processor .*test_logits_processor\._Raising raised in apply\(\): "
                                            "ValueError: too many dimensions"):
            llm.generate(["Hello"], SamplingParams(max_tokens=2), use_tqdm=False)
    finally:
        llm.shutdown()
