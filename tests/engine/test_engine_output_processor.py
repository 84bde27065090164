"""The output side on its own: streaming kinds, stop strings, n > 1 merging, aborts."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from forkless.config import EngineArgs
from forkless.core.request import FinishReason
from forkless.core.sched import EngineCoreOutput
from forkless.engine.output_processor import OutputProcessor
from forkless.engine.processor import Processor
from forkless.sampling_params import RequestOutputKind, SamplingParams

TEXT = " jumps over the lazy dog. Paris is the capital"


@pytest.fixture(scope="module")
def parts(llama_dir):
    config = EngineArgs(model=str(llama_dir)).create_engine_config()
    tok = AutoTokenizer.from_pretrained(llama_dir)
    return Processor(config, tok), tok


def _feed(out_proc: OutputProcessor, rid: str, ids: list[int], last_reason=None):
    results = []
    for i, tok_id in enumerate(ids):
        reason = last_reason if i == len(ids) - 1 else None
        results.append(out_proc.process_outputs([EngineCoreOutput(rid, [tok_id], reason)]))
    return results


def test_delta_outputs_concatenate_to_the_final_text(parts) -> None:
    processor, tok = parts
    ids = tok.encode(TEXT)
    out_proc = OutputProcessor(tok)
    params = SamplingParams(max_tokens=len(ids), output_kind=RequestOutputKind.DELTA)
    out_proc.add_request(processor.process_inputs("r", "The quick brown fox", params))
    results = _feed(out_proc, "r", ids, FinishReason.LENGTH)
    deltas = [o.outputs[0] for r in results for o in r.request_outputs]
    assert "".join(d.text for d in deltas) == TEXT
    assert [t for d in deltas for t in d.token_ids] == ids
    assert deltas[-1].finish_reason == "length" and not out_proc.has_unfinished_requests()
    timing = results[-1].finished[0]
    assert timing.num_generation_tokens == len(ids) and timing.ttft is not None


def test_final_only_emits_once(parts) -> None:
    processor, tok = parts
    ids = tok.encode(TEXT)
    out_proc = OutputProcessor(tok)
    params = SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY)
    out_proc.add_request(processor.process_inputs("r", "Hi", params))
    results = _feed(out_proc, "r", ids, FinishReason.LENGTH)
    emitted = [o for r in results for o in r.request_outputs]
    assert len(emitted) == 1 and emitted[0].finished and emitted[0].outputs[0].text == TEXT


def test_stop_string_is_held_back_then_truncated_and_aborted(parts) -> None:
    processor, tok = parts
    ids = tok.encode(TEXT)
    out_proc = OutputProcessor(tok)
    out_proc.add_request(processor.process_inputs("r", "Hi", SamplingParams(stop=["lazy dog"])))
    results = _feed(out_proc, "r", ids)
    streamed = [o.outputs[0].text for r in results for o in r.request_outputs]
    assert all("lazy" not in t for t in streamed)  # a possible stop string is never shown
    final = [o for r in results for o in r.request_outputs if o.finished]
    assert final[0].outputs[0].text == " jumps over the "
    assert final[0].outputs[0].stop_reason == "lazy dog"
    assert [rid for r in results for rid in r.reqs_to_abort] == ["r"]


def test_n_children_merge_and_abort_by_parent(parts) -> None:
    processor, tok = parts
    processed = processor.process_inputs("p", "Hi", SamplingParams(n=2, seed=5, max_tokens=3))
    assert [r.request_id for r in processed.core_requests] == ["0_p", "1_p"]
    assert [r.sampling_params.seed for r in processed.core_requests] == [5, 6]
    out_proc = OutputProcessor(tok)
    out_proc.add_request(processed)
    r1 = out_proc.process_outputs([EngineCoreOutput("0_p", [40], FinishReason.LENGTH),
                                   EngineCoreOutput("1_p", [41])])
    assert not r1.request_outputs[0].finished and len(r1.request_outputs[0].outputs) == 2
    assert out_proc.abort_requests(["p"]) == ["1_p"]
    assert not out_proc.has_unfinished_requests()


def test_detokenize_false_returns_token_ids_only(parts) -> None:
    # The benchmarks' setting: no text is made, so no per-token detokenization cost.
    processor, tok = parts
    ids = tok.encode(TEXT)
    out_proc = OutputProcessor(tok)
    params = SamplingParams(max_tokens=len(ids), detokenize=False, logprobs=1)
    out_proc.add_request(processor.process_inputs("r", "Hi", params))
    results = []
    for i, tok_id in enumerate(ids):
        reason = FinishReason.LENGTH if i == len(ids) - 1 else None
        out = EngineCoreOutput("r", [tok_id], reason, new_logprobs=[[tok_id], [-0.5], 1])
        results.append(out_proc.process_outputs([out]))
    final = results[-1].request_outputs[0].outputs[0]
    assert final.text == "" and final.token_ids == ids and final.finish_reason == "length"
    assert all(e[t].decoded_token is None for e, t in zip(final.logprobs, ids))


def test_detokenize_false_rejects_stop_strings() -> None:
    with pytest.raises(ValueError, match="detokenize=False"):
        SamplingParams(stop=["x"], detokenize=False)
    assert SamplingParams(stop_token_ids=[3], detokenize=False).stop_token_ids == [3]


def test_llm_generate_leaves_callers_params_untouched(llama_dir) -> None:
    # generate() asks the output processor for final outputs only, on a copy.
    from forkless import LLM

    llm = LLM(str(llama_dir), kv_cache_memory=1 << 22)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    out = llm.generate(["Hello", "Hi there"], params, use_tqdm=False)
    assert params.output_kind is RequestOutputKind.CUMULATIVE
    assert [len(o.outputs[0].token_ids) for o in out] == [5, 5] and all(o.finished for o in out)


def test_n_children_delta_outputs_add_up_per_completion(parts) -> None:
    # DELTA with n > 1: an output carries only the completions that changed; folding
    # them with RequestOutput.add (what a slow AsyncLLM reader gets) gives each
    # completion's whole text, tokens and logprobs. The parent finishes when its last
    # child does, and CUMULATIVE outputs still carry everything.
    processor, tok = parts
    ids = tok.encode(TEXT)
    for kind in (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE):
        params = SamplingParams(n=2, max_tokens=len(ids), logprobs=1, prompt_logprobs=1, output_kind=kind)
        out_proc = OutputProcessor(tok)
        out_proc.add_request(processor.process_inputs("p", "Hi there", params))
        emitted = []
        for step, tok_id in enumerate(ids):
            last = step == len(ids) - 1
            outs = [EngineCoreOutput("0_p", [tok_id], FinishReason.LENGTH if last else None,
                                     new_logprobs=[[tok_id], [-0.5], 1],
                                     new_prompt_logprobs=[[[5], [-1.0], 1]] if step == 0 else None)]
            if step % 2 == 0 or last:  # the second child moves every other step
                outs.append(EngineCoreOutput("1_p", [tok_id], FinishReason.LENGTH if last else None,
                                             new_logprobs=[[tok_id], [-0.25], 1]))
            emitted += out_proc.process_outputs(outs).request_outputs
        assert not out_proc.has_unfinished_requests()
        assert [o.finished for o in emitted] == [False] * (len(emitted) - 1) + [True]
        if kind is RequestOutputKind.CUMULATIVE:
            assert all(len(o.outputs) == 2 for o in emitted)
            assert emitted[-1].outputs[0].text == TEXT and emitted[-1].outputs[0].token_ids == ids
            assert emitted[-1].prompt_logprobs is not None
            continue
        assert [len(o.outputs) for o in emitted[:3]] == [2, 1, 2]
        assert sum(o.prompt_logprobs is not None for o in emitted) == 1
        first = emitted[0]
        for later in emitted[1:]:
            first.add(later, aggregate=True)
        assert first.prompt_logprobs is not None and first.finished
        assert [c.index for c in first.outputs] == [0, 1]
        for c, value in zip(first.outputs, (-0.5, -0.25)):
            sent = [t for t in ids] if c.index == 0 else [t for i, t in enumerate(ids)
                                                          if i % 2 == 0 or i == len(ids) - 1]
            assert c.token_ids == sent and c.finish_reason == "length"
            assert [list(e) for e in c.logprobs] == [[t] for t in sent]
            assert c.cumulative_logprob == pytest.approx(value * len(sent))
        assert first.outputs[0].text == TEXT


def test_stream_interval_holds_delta_outputs_until_that_many_tokens_are_new(parts) -> None:
    # vLLM's rule: a completion's first token at once, then an output every `interval` new
    # tokens, and its last at once; the interval is the larger of the engine's and the
    # request's. Each completion of n > 1 counts its own tokens. Other kinds are unaffected.
    processor, tok = parts
    ids = tok.encode(TEXT)[:10]
    cases = [(1, 4, [1, 4, 4, 1]), (3, None, [1, 3, 3, 3]), (3, 2, [1, 3, 3, 3]), (1, 20, [1, 9]),
             (1, None, [1] * 10)]
    for engine_interval, asked, sizes in cases:
        out_proc = OutputProcessor(tok, stream_interval=engine_interval)
        params = SamplingParams(n=2, max_tokens=len(ids), output_kind=RequestOutputKind.DELTA, stream_interval=asked)
        out_proc.add_request(processor.process_inputs("p", "Hi", params))
        emitted = []
        for step, tok_id in enumerate(ids):
            reason = FinishReason.LENGTH if step == len(ids) - 1 else None
            outs = [EngineCoreOutput("0_p", [tok_id], reason), EngineCoreOutput("1_p", [tok_id], reason)]
            emitted += out_proc.process_outputs(outs).request_outputs
        got = {index: [len(c.token_ids) for o in emitted for c in o.outputs if c.index == index] for index in (0, 1)}
        assert got == {0: sizes, 1: sizes}, (engine_interval, asked)
        assert "".join(c.text for o in emitted for c in o.outputs if c.index == 0) == tok.decode(ids)
        assert emitted[-1].finished and not out_proc.has_unfinished_requests()
    out_proc = OutputProcessor(tok, stream_interval=4)
    out_proc.add_request(processor.process_inputs("c", "Hi", SamplingParams(max_tokens=len(ids), stream_interval=4)))
    assert len([o for r in _feed(out_proc, "c", ids, FinishReason.LENGTH) for o in r.request_outputs]) == len(ids)
    with pytest.raises(ValueError, match="stream_interval"):
        SamplingParams(stream_interval=0)


def test_the_engines_stream_interval_is_a_checked_setting(llama_dir) -> None:
    config = EngineArgs(model=str(llama_dir), stream_interval=3).create_engine_config()
    assert config.scheduler_config.stream_interval == 3
    assert EngineArgs(model=str(llama_dir)).create_engine_config().scheduler_config.stream_interval == 1
    with pytest.raises(ValueError, match="stream_interval must be an integer >= 1"):
        EngineArgs(model=str(llama_dir), stream_interval=0).create_engine_config()


def test_a_delta_output_missing_a_lower_index_is_added_in_order() -> None:
    from forkless.outputs import CompletionOutput, RequestOutput

    def out(*completions: CompletionOutput, finished: bool = False) -> RequestOutput:
        return RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1], outputs=list(completions),
                             finished=finished)

    merged = out(CompletionOutput(index=1, text="b", token_ids=[2]))
    merged.add(out(CompletionOutput(index=0, text="a", token_ids=[1])))
    merged.add(out(CompletionOutput(index=1, text="B", token_ids=[3], finish_reason="stop", stop_reason="x"),
                   finished=True))
    assert [(c.index, c.text, c.token_ids, c.finish_reason) for c in merged.outputs] == [
        (0, "a", [1], None), (1, "bB", [2, 3], "stop")]
    assert merged.finished and merged.outputs[1].stop_reason == "x"
    replaced = out(CompletionOutput(index=0, text="a", token_ids=[1]))
    replaced.add(out(CompletionOutput(index=0, text="ab", token_ids=[1, 2])), aggregate=False)
    assert replaced.outputs[0].text == "ab" and replaced.outputs[0].token_ids == [1, 2]


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE])
def test_two_outputs_of_one_request_in_one_message_make_one_completion(parts, kind) -> None:
    # Async scheduling with speculative decoding can apply two steps' results before the
    # engine core sends them: the request's completion must appear once and hold both
    # tokens (the server's stream kept only the last completion of an index, losing them).
    processor, tok = parts
    ids = tok.encode(TEXT)[:3]
    out_proc = OutputProcessor(tok)
    out_proc.add_request(processor.process_inputs("r", "Hi", SamplingParams(max_tokens=3, output_kind=kind)))
    first = out_proc.process_outputs([EngineCoreOutput("r", [ids[0]]), EngineCoreOutput("r", [ids[1]])])
    (output,) = first.request_outputs
    assert [(c.index, c.token_ids) for c in output.outputs] == [(0, ids[:2])]
    last = out_proc.process_outputs([EngineCoreOutput("r", [ids[2]], FinishReason.LENGTH)])
    (final,) = last.request_outputs
    assert final.outputs[0].token_ids == (ids[2:] if kind is RequestOutputKind.DELTA else ids)


def test_a_stop_tokens_text_is_left_out_unless_asked_for(parts) -> None:
    # vLLM's rule: the token that stopped the request (EOS or stop_token_ids) stays in the
    # token ids, its text only with include_stop_str_in_output.
    processor, tok = parts
    ids = tok.encode(" jumps over the lazy")
    texts = {}
    for include in (False, True):
        out_proc = OutputProcessor(tok)
        params = SamplingParams(stop_token_ids=[ids[-1]], include_stop_str_in_output=include)
        out_proc.add_request(processor.process_inputs("r", "Hi", params))
        results = _feed(out_proc, "r", ids, FinishReason.STOP)
        final = [o for r in results for o in r.request_outputs if o.finished][0].outputs[0]
        assert final.token_ids == ids
        texts[include] = final.text
    assert texts == {False: tok.decode(ids[:-1]), True: tok.decode(ids)} and texts[False] != texts[True]


def test_prompt_tokens_and_ttft_count_at_the_first_token_not_at_the_end(parts) -> None:
    # vLLM's iteration stats: a request's prompt tokens and time to first token belong to
    # the batch that brought its first token, so rates and TTFT do not lag a generation.
    from forkless.metrics import iteration_stats

    processor, tok = parts
    ids = tok.encode(TEXT)
    out_proc = OutputProcessor(tok)
    prompt = "The quick brown fox"
    out_proc.add_request(processor.process_inputs("r", prompt, SamplingParams(max_tokens=len(ids))))
    results = _feed(out_proc, "r", ids, FinishReason.LENGTH)
    stats = [iteration_stats(r.num_new_tokens, r.finished, r.first_tokens) for r in results]
    prompt_len = len(tok.encode(prompt))
    assert [s.num_prompt_tokens for s in stats] == [prompt_len] + [0] * (len(ids) - 1)
    assert [len(s.time_to_first_tokens) for s in stats] == [1] + [0] * (len(ids) - 1)
    assert [len(s.finished_requests) for s in stats] == [0] * (len(ids) - 1) + [1]
    assert sum(s.num_generation_tokens for s in stats) == len(ids)


def test_a_stop_string_in_the_first_min_tokens_tokens_does_not_stop(parts) -> None:
    # vLLM's rule: the text of tokens 1..min_tokens is never searched for stop strings, so
    # "over" stops the output when its last character comes in token min_tokens + 1 or
    # later, and is no stop string when it comes in token min_tokens (then "lazy" is).
    processor, tok = parts
    ids = tok.encode(TEXT)
    k = next(k for k in range(1, len(ids) + 1) if "over" in tok.decode(ids[:k]))  # the token ending "over"
    finals = {}
    for min_tokens in (k - 1, k):
        out_proc = OutputProcessor(tok)
        params = SamplingParams(stop=["over", "lazy"], min_tokens=min_tokens)
        out_proc.add_request(processor.process_inputs("r", "Hi", params))
        results = _feed(out_proc, "r", ids)
        finals[min_tokens] = [o for r in results for o in r.request_outputs if o.finished][0].outputs[0]
    assert (finals[k - 1].text, finals[k - 1].stop_reason) == (" jumps ", "over")
    assert (finals[k].text, finals[k].stop_reason) == (" jumps over the ", "lazy")


def test_phases_of_a_request_that_never_made_a_token_are_zero_not_negative(parts) -> None:
    # vLLM's phases (queued, prefill, decode, inference) are differences of the engine
    # core's event times; one never reached is 0, and must not turn into minus the other
    # (a request scheduled, then finished before its first token, e.g. a KV-load failure).
    from forkless.metrics import iteration_stats
    from forkless.protocol.step import EngineCoreEvent, EngineCoreEventType

    processor, tok = parts
    out_proc = OutputProcessor(tok, log_stats=True)
    out_proc.add_request(processor.process_inputs("r", "Hi", SamplingParams(max_tokens=4)))
    events = [EngineCoreEvent(EngineCoreEventType.QUEUED, 100.0), EngineCoreEvent(EngineCoreEventType.SCHEDULED, 100.5)]
    result = out_proc.process_outputs([EngineCoreOutput("r", [], FinishReason.ABORT, events=events)],
                                      core_time=101.0)
    (finished,) = iteration_stats(result.num_new_tokens, result.finished, result.first_tokens).finished_requests
    assert finished.queued_time == 0.5
    assert (finished.prefill_time, finished.decode_time, finished.inference_time) == (0.0, 0.0, 0.0)


def test_inter_token_latencies_are_one_gap_per_output_after_the_first(parts) -> None:
    # vLLM's inter_token_latencies_iter: each output after a request's first adds the time
    # since its previous one, so a dashboard's ITL quantiles see every stall, not a
    # per-request mean at the end.
    from forkless.metrics import iteration_stats

    processor, tok = parts
    out_proc = OutputProcessor(tok, log_stats=True)
    out_proc.add_request(processor.process_inputs("r", "Hi", SamplingParams(max_tokens=4)))
    times = [10.0, 10.5, 12.5, 12.75]
    stats = []
    for i, now in enumerate(times):
        reason = FinishReason.LENGTH if i == len(times) - 1 else None
        r = out_proc.process_outputs([EngineCoreOutput("r", [tok.encode(" a")[0]], reason)], now=now)
        stats.append(iteration_stats(r.num_new_tokens, r.finished, r.first_tokens, r.inter_token_latencies))
    assert [s.inter_token_latencies_iter for s in stats] == [[], [0.5], [2.0], [0.25]]
    (finished,) = stats[-1].finished_requests
    assert finished.mean_time_per_output_token == (12.75 - 10.0) / 3
