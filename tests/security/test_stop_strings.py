"""Stop strings: the indexed matcher finds what a scan of every stop string found, across
token boundaries and with include_stop_str_in_output, and refuses over-long ones."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from forkless.config import EngineArgs
from forkless.core.sched import EngineCoreOutput
from forkless.engine.output_processor import OutputProcessor
from forkless.engine.processor import Processor
from forkless.engine.stop_strings import MAX_STOP_STRING_CHARS, StopStringMatcher, find_stop_string
from forkless.sampling_params import SamplingParams


def scan_every_stop_string(text: str, num_new_chars: int, stop: list[str],
                           include: bool) -> tuple[str, int] | None:
    """One ``str.find`` per stop string, by vLLM's rule: the match that ends first wins,
    then the one listed first."""
    best: tuple[int, int, str] | None = None  # (end, order, string)
    for order, s in enumerate(stop):
        start = text.find(s, max(0, len(text) - num_new_chars - len(s) + 1))
        if start != -1 and (best is None or (start + len(s), order) < best[:2]):
            best = (start + len(s), order, s)
    if best is None:
        return None
    end, _, s = best
    return s, end if include else end - len(s)


def test_same_matches_as_scanning_every_stop_string_on_random_cases() -> None:
    rng = random.Random(1234)
    checked = matched = 0
    for _ in range(3000):
        alphabet = "ab" if rng.random() < 0.5 else "abc "  # small: many overlapping matches
        stop = ["".join(rng.choices(alphabet, k=rng.randint(1, 6))) for _ in range(rng.randint(1, 8))]
        matcher = StopStringMatcher(stop)
        include = rng.random() < 0.5
        text = ""
        for _ in range(rng.randint(1, 12)):  # text arriving in pieces, as from tokens
            new = "".join(rng.choices(alphabet, k=rng.randint(1, 5)))
            text += new
            expected = scan_every_stop_string(text, len(new), stop, include)
            assert matcher.find(text, len(new), include) == expected, (stop, text, len(new), include)
            checked += 1
            if expected is not None:
                matched += 1
                break  # a real request stops here
    assert matched > 1000 and checked > 3000  # the cases exercised matches, not only misses


def test_the_match_that_ends_first_wins_then_the_one_listed_first() -> None:
    # "ab" ends before "abc" when "bc" arrives, whatever the list order (vLLM's rule).
    assert find_stop_string("xabc", 2, ["ab", "abc"], True) == ("ab", 3)
    assert find_stop_string("xabc", 2, ["abc", "ab"], True) == ("ab", 3)
    # Two that end at the same place: the one listed first.
    assert find_stop_string("xabc", 2, ["bc", "abc"], False) == ("bc", 2)
    assert find_stop_string("xabc", 2, ["abc", "bc"], False) == ("abc", 1)
    # The earliest end wins over the list order.
    assert find_stop_string("xyzab", 3, ["ab", "yz"], False) == ("yz", 1)
    # Only matches that end in the new text count: "yz" ended before it.
    assert find_stop_string("xyzab", 2, ["yz"], False) is None


def test_many_stop_strings_cost_one_lookup_per_distinct_length() -> None:
    stop = [f"stop-{i:06d}" for i in range(100_000)] + ["needle"]
    matcher = StopStringMatcher(stop)
    assert matcher.lengths == (11, 6)  # two lookups per new character, not 100,001
    assert matcher.find("a haystack with a needle", 8, False) == ("needle", 18)


def test_over_long_stop_strings_are_refused() -> None:
    StopStringMatcher(["x" * MAX_STOP_STRING_CHARS])
    with pytest.raises(ValueError, match=f"at most {MAX_STOP_STRING_CHARS}"):
        StopStringMatcher(["ok", "x" * (MAX_STOP_STRING_CHARS + 1)])


@pytest.fixture(scope="module")
def parts(tiny_llama: Path) -> tuple[Processor, object]:
    config = EngineArgs(model=str(tiny_llama)).create_engine_config()
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    return Processor(config, tok), tok


def _run(parts, text: str, params: SamplingParams) -> tuple[str, list[str], str | int | None, list[str]]:
    """Feed ``text``'s tokens one by one; (final text, texts streamed, stop_reason, aborted ids)."""
    processor, tok = parts
    out_proc = OutputProcessor(tok)
    out_proc.add_request(processor.process_inputs("r", "Hi", params))
    streamed, aborted = [], []
    for tok_id in tok.encode(text):
        result = out_proc.process_outputs([EngineCoreOutput("r", [tok_id])])
        aborted += result.reqs_to_abort
        for out in result.request_outputs:
            streamed.append(out.outputs[0].text)
            if out.finished:
                return out.outputs[0].text, streamed, out.outputs[0].stop_reason, aborted
    raise AssertionError(f"no stop string matched in {text!r}")


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_spanning_tokens_truncates_the_text(parts, include: bool) -> None:
    _, tok = parts
    text = " The quick brown fox jumps over the lazy dog"
    stop = "own fox ju"  # starts and ends inside tokens
    pieces = [tok.decode([t]) for t in tok.encode(text)]
    assert not any(stop in p for p in pieces) and len(pieces) > 5  # it spans several tokens
    params = SamplingParams(stop=["zzz", stop, "lazy"], include_stop_str_in_output=include)
    final, streamed, reason, aborted = _run(parts, text, params)
    assert final == (" The quick brown fox ju" if include else " The quick br")
    assert reason == stop and aborted == ["r"]
    assert all(stop not in s for s in streamed[:-1])  # held back until it was known


def test_the_earliest_of_many_stop_strings_wins_across_tokens(parts) -> None:
    stop = [f"never-{i}" for i in range(5000)] + ["lazy dog", "over the"]
    final, _, reason, _ = _run(parts, " The quick brown fox jumps over the lazy dog", SamplingParams(stop=stop))
    assert (final, reason) == (" The quick brown fox jumps ", "over the")
