"""The offline API as a vLLM user calls it: output kinds, chat's arguments in vLLM's order,
prompt dicts, and vLLM's top-level names."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkless import LLM, RequestOutputKind, SamplingParams

CHAT = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def llm(tiny_llama: Path):
    engine = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24)
    yield engine
    engine.shutdown()


def _tokens(out) -> list[list[int]]:
    return [list(c.token_ids) for c in out.outputs]


def test_every_output_kind_returns_the_whole_completion(llm: LLM) -> None:
    # generate() keeps one output per request; a DELTA request used to come back with its
    # last step's token alone.
    base = dict(max_tokens=8, ignore_eos=True, logprobs=1, n=2, seed=1)  # (seeded: the same tokens each time)
    whole = llm.generate("Hello there", SamplingParams(**base), use_tqdm=False)[0]
    for kind in (RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY):
        params = SamplingParams(**base, output_kind=kind)
        out = llm.generate("Hello there", params, use_tqdm=False)[0]
        assert _tokens(out) == _tokens(whole) and all(len(t) == 8 for t in _tokens(out))
        assert [c.text for c in out.outputs] == [c.text for c in whole.outputs]
        assert [len(c.logprobs) for c in out.outputs] == [8, 8]
        assert params.output_kind is kind  # the caller's params are left as they were


def test_an_infinite_logit_bias_is_refused_and_minus_infinity_bans(llm: LLM) -> None:
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate("Hi", SamplingParams(max_tokens=2, logit_bias={5: float("inf")}), use_tqdm=False)
    greedy = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    first = greedy.outputs[0].token_ids[0]
    banned = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=1, logit_bias={first: float("-inf")}),
                          use_tqdm=False)[0]
    assert banned.outputs[0].token_ids[0] != first


def test_sampling_params_as_a_dict_is_a_type_error(llm: LLM) -> None:
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.generate("Hi", {"max_tokens": 2}, use_tqdm=False)


def test_use_tqdm_may_be_a_callable_making_the_bar(llm: LLM) -> None:
    # vLLM's use_tqdm takes a callable that makes the bar; it used to be taken for True,
    # and forkless's own bar shown instead.
    class Bar:
        def __init__(self, **kwargs) -> None:
            self.kwargs, self.count, self.closed = kwargs, 0, False
            made.append(self)

        def update(self, n: int = 1) -> None:
            self.count += n

        def close(self) -> None:
            self.closed = True

    made: list[Bar] = []
    params = SamplingParams(max_tokens=1)
    assert len(llm.generate(["a", "b"], params, use_tqdm=Bar)) == 2
    llm.chat(CHAT, params, use_tqdm=Bar)
    [bar, chat_bar] = made
    assert bar.kwargs == {"total": 2, "desc": "Processed prompts", "dynamic_ncols": True}
    assert (bar.count, bar.closed, chat_bar.count, chat_bar.closed) == (2, True, 1, True)


def test_vllms_engine_attributes(llm: LLM) -> None:
    # What vLLM scripts read through llm.llm_engine; each was an AttributeError.
    engine = llm.llm_engine
    assert engine.model_config.max_model_len == llm.model_config.max_model_len == 256
    assert engine.vllm_config.model_config is engine.model_config
    assert engine.tokenizer is engine.get_tokenizer() is llm.get_tokenizer()


def test_request_output_has_vllms_metrics_field(llm: LLM) -> None:
    out = llm.generate("Hi", SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert out.metrics is None  # as vLLM's LLM without log stats; an AttributeError before


def test_chat_takes_vllms_arguments_in_vllms_order(llm: LLM) -> None:
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    # (messages, sampling_params, use_tqdm, lora_request, priority, chat_template, ...)
    out = llm.chat(CHAT, params, False, None, 0, template)[0]
    assert out.prompt == "<user>Hello"
    assert len(out.outputs[0].token_ids) == 3
    # "openai": content reaches the template as a list of text parts.
    parts = "{% for m in messages %}{% for p in m.content %}[{{ p.type }}:{{ p.text }}]{% endfor %}{% endfor %}"
    out = llm.chat(CHAT, params, use_tqdm=False, chat_template=parts, chat_template_content_format="openai")[0]
    assert out.prompt == "[text:Hello]"
    with pytest.raises(ValueError, match="chat_template_content_format"):
        llm.chat(CHAT, params, use_tqdm=False, chat_template_content_format="parts")
    with pytest.raises(ValueError, match="mm_processor_kwargs"):
        llm.chat(CHAT, params, use_tqdm=False, mm_processor_kwargs={"max_pixels": 4})
    with pytest.raises(ValueError, match="messages is empty"):
        llm.chat([], params, use_tqdm=False)
    for bad_id in (5, ""):  # vLLM's request ids are strings
        with pytest.raises(ValueError, match="request_id=.* expected a non-empty string"):
            llm.llm_engine.add_request(bad_id, "Hello", params)
    with pytest.raises(ValueError, match="enable_lora"):
        from forkless.lora.request import LoRARequest

        llm.chat(CHAT, params, use_tqdm=False, lora_request=LoRARequest("a", 1, "/nonexistent"))


@pytest.mark.parametrize("prompt,match", [
    ({"prompt": "Hi", "multi_modal_data": {"image": "x.png"}}, "multi_modal_data.*text only"),
    ({"prompt": "Hi", "promt_token_ids": [1]}, "unknown key 'promt_token_ids'"),
    ({"prompt_token_ids": "123"}, "prompt_token_ids must be a list of token ids"),
    ({"prompt_token_ids": [5.7, 6.2]}, r"prompt_token_ids\[0\] must be a token id"),
    ({"prompt_token_ids": [5, True]}, r"prompt_token_ids\[1\] must be a token id"),
    ({"prompt_token_ids": [5, 6], "token_type_ids": [0, 0]}, "token_type_ids is for cross-encoder"),
])
def test_prompt_dicts_refuse_what_they_would_ignore(llm: LLM, prompt: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        llm.generate(prompt, SamplingParams(max_tokens=1), use_tqdm=False)


def test_prompt_dicts_of_vllms_types(llm: LLM) -> None:
    import numpy as np

    from forkless.inputs import TextPrompt, TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    ids = llm.get_tokenizer().encode("Hello there", add_special_tokens=False)
    by_text, by_ids, by_numpy = llm.generate(
        [TextPrompt(prompt="Hello there"), TokensPrompt(prompt_token_ids=ids),
         {"prompt_token_ids": np.array(ids)}], params, use_tqdm=False)
    assert by_text.prompt_token_ids == by_ids.prompt_token_ids == by_numpy.prompt_token_ids == ids
    assert _tokens(by_text) == _tokens(by_ids) == _tokens(by_numpy)


def test_vllms_top_level_names() -> None:
    import forkless
    from forkless import (  # noqa: F401
        AsyncEngineArgs, CompletionOutput, EngineArgs, LLMEngine, PoolingParams, RequestOutput, TextPrompt,
        TokensPrompt,
    )
    from forkless.outputs import RequestOutput as Direct

    assert RequestOutput is Direct
    assert all(hasattr(forkless, name) for name in forkless.__all__)


def test_disable_log_stats_false_gives_vllms_per_request_metrics(tiny_llama: Path) -> None:
    import time

    from forkless.v1.metrics.stats import RequestStateStats

    # One sequence at a time: the second prompt waits in the queue while the first runs.
    llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24, max_num_seqs=1,
              disable_log_stats=False)
    try:
        wall, mono = time.time(), time.monotonic()
        first, second = llm.generate(["Hello there", "General Kenobi"],
                                     SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
        wall_end, mono_end = time.time(), time.monotonic()
    finally:
        llm.shutdown()
    for out in (first, second):
        m = out.metrics
        assert isinstance(m, RequestStateStats)
        assert m.num_generation_tokens == len(out.outputs[0].token_ids) == 5
        # vLLM's clocks: arrival (and the latency from it) on the wall clock, the engine
        # core's times on the monotonic one.
        assert wall <= m.arrival_time <= wall_end
        assert 0 < m.first_token_latency <= wall_end - m.arrival_time
        assert mono <= m.queued_ts <= m.scheduled_ts <= m.first_token_ts < m.last_token_ts <= mono_end
        assert m.is_corrupted is False
    # The second was queued with the first and scheduled only once the first was done.
    assert second.metrics.queued_ts <= first.metrics.scheduled_ts
    assert second.metrics.scheduled_ts >= first.metrics.last_token_ts
    assert second.metrics.first_token_latency > first.metrics.first_token_latency
