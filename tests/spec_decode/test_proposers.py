"""The ngram proposer, the proposer registry and ``--speculative-config`` parsing."""

from __future__ import annotations

import numpy as np
import pytest

from forkless.plugins import RegistryError
from forkless.spec_decode import ProposalBatch, Proposer, ProposerRegistry, SpeculativeConfig
from forkless.spec_decode.ngram import NgramProposer, propose_ngram


def _batch(*histories: list[int]) -> ProposalBatch:
    width = max(len(h) for h in histories)
    ids = np.full((len(histories), width), -7, dtype=np.int64)  # padding is never read
    for i, h in enumerate(histories):
        ids[i, : len(h)] = h
    return ProposalBatch([f"r{i}" for i in range(len(histories))], ids,
                         np.array([len(h) for h in histories], dtype=np.int64))


def test_ngram_continues_the_latest_earlier_occurrence() -> None:
    #           0  1  2  3  4  5  6  7  8  9 10 11
    history = [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7]
    # Suffix "5 6 7" occurs at 0 (followed by 8 1 ...) and at 5 (followed by 9 2 ...):
    # the latest wins.
    assert propose_ngram(np.array(history), 1, 3, 3).tolist() == [9, 2, 5]


def test_ngram_prefers_the_longest_suffix() -> None:
    # "7" alone last occurs at 5 (-> 3); "6 7" occurs only at 1..2 (-> 4): longer wins.
    history = [1, 6, 7, 4, 0, 7, 3, 9, 6, 7]
    assert propose_ngram(np.array(history), 1, 2, 2).tolist() == [4, 0]
    assert propose_ngram(np.array(history), 1, 1, 2).tolist() == [3, 9]


def test_ngram_no_match_no_draft_and_never_past_the_end() -> None:
    assert propose_ngram(np.array([1, 2, 3, 4]), 1, 3, 4).tolist() == []
    assert propose_ngram(np.array([1]), 1, 3, 4).tolist() == []
    # The match is right before the end: fewer than k tokens follow it.
    assert propose_ngram(np.array([4, 4, 4]), 1, 2, 5).tolist() == [4]


def test_ngram_proposer_reads_each_row_to_its_length() -> None:
    config = SpeculativeConfig.from_json(
        '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 2}')
    proposer = ProposerRegistry.resolve(config.method)(config)
    assert isinstance(proposer, NgramProposer)
    out = proposer.propose(_batch([1, 2, 3, 1, 2], [9, 8, 9], [5]))
    assert out == [[3, 1], [8, 9], []]


def test_ngram_is_vectorised_on_a_long_history() -> None:
    rng = np.random.default_rng(0)
    history = rng.integers(0, 50_000, size=32_768)
    history[-4:] = history[100:104]
    assert propose_ngram(history, 2, 4, 4).tolist() == history[104:108].tolist()


def test_config_keys_and_errors() -> None:
    c = SpeculativeConfig.from_json({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)  # vLLM: one given means both
    c = SpeculativeConfig.from_json({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (2, 2)
    c = SpeculativeConfig.from_json({"method": "ngram", "num_speculative_tokens": 4})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)  # vLLM: neither given means 5
    assert SpeculativeConfig.from_json({"model": "/m", "num_speculative_tokens": 2}).method == "draft_model"
    bad = [
        ("[1]", "JSON object"),
        ("{", "not valid JSON"),
        ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "lookahead": 1}', "'lookahead'"),
        ('{"method": "ngram", "num_speculative_tokens": 0, "prompt_lookup_max": 3}', "num_speculative_tokens"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}', "prompt_lookup_min"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
         "larger than"),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', "'model'"),
        ('{"model": "/m", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2}', "only 1"),
        ('{"num_speculative_tokens": 2}', "'method' is required"),
    ]
    for text, needle in bad:
        with pytest.raises(ValueError, match=None) as info:
            SpeculativeConfig.from_json(text)
        assert needle in str(info.value), (text, str(info.value))


class EchoLast(Proposer):
    """Guesses that the last token repeats."""

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        return [[int(batch.token_ids[i, n - 1])] * self.num_speculative_tokens
                for i, n in enumerate(batch.num_tokens)]


def test_registry_by_name_by_path_and_unknown_names() -> None:
    ProposerRegistry.register("echo-last", f"{__name__}:EchoLast")
    config = SpeculativeConfig(method="echo-last", num_speculative_tokens=2)
    assert ProposerRegistry.resolve("echo-last") is EchoLast
    assert "echo-last" in ProposerRegistry.get_supported_methods()
    assert ProposerRegistry.resolve(f"{__name__}:EchoLast")(config).propose(_batch([3, 4])) == [[4, 4]]
    with pytest.raises(RegistryError, match="registered: .*ngram"):
        ProposerRegistry.resolve("eagle9")
    with pytest.raises(TypeError, match="not a forkless.spec_decode.Proposer"):
        ProposerRegistry.resolve("numpy:ndarray")


def test_ngram_backs_off_after_rejected_drafts() -> None:
    # Over tokens 1-3 the lookup always finds a guess; a target that always emits another
    # token than the guess's first gets fewer and fewer drafts.
    config = SpeculativeConfig.from_json({"method": "ngram", "num_speculative_tokens": 2,
                                          "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    proposer = NgramProposer(config)
    history = [1, 2, 3, 1, 2, 3, 1, 2]
    drafted = []
    for _ in range(24):
        draft = proposer.propose(ProposalBatch(["r"], np.array([history]), np.array([len(history)])))[0]
        drafted.append(bool(draft))
        history = history + [draft[0] % 3 + 1 if draft else 1]  # never the guess
    # Two rejected drafts in a row -> 2 lookups skipped, three -> 4, then 8, then 16 (the cap).
    assert [i for i, d in enumerate(drafted) if d] == [0, 1, 4, 9, 18]
    # Once the skipped lookups are over, a kept draft token ends the streak: a target that
    # follows the guesses gets a draft every step.
    def step(rid: str, follow: bool) -> list[int]:
        nonlocal history
        draft = proposer.propose(ProposalBatch([rid], np.array([history]), np.array([len(history)])))[0]
        history = history + (draft[:1] if draft and follow else [1])
        return draft

    while not step("r", follow=True):
        pass
    assert all(step("r", follow=True) for _ in range(12))
    # A target that keeps only the first token of each draft gets 1-token drafts (the
    # second token would be verified for nothing); one that keeps whole drafts gets
    # num_speculative_tokens again.
    assert {len(step("r", follow=True)) for _ in range(6)} == {1}

    def keep_all(rid: str) -> list[int]:
        nonlocal history
        draft = proposer.propose(ProposalBatch([rid], np.array([history]), np.array([len(history)])))[0]
        history = history + draft + [draft[-1] % 3 + 1] if draft else history + [1]
        return draft

    assert [len(keep_all("r")) for _ in range(4)] == [1, 2, 2, 2]
    # State is per request: a new one gets drafts at once.
    history = [1, 2, 3, 1, 2, 3, 1, 2]
    assert all(step("s", follow=True) for _ in range(12))


def test_ngram_judges_only_the_drafts_a_step_scored() -> None:
    """A draft the step never scored (async scheduling ran the step before the draft was
    known, or the budget left no room) neither shrinks the draft length nor backs off;
    the scored part of a draft cut short by the scheduler counts as kept whole."""
    config = SpeculativeConfig.from_json({"method": "ngram", "num_speculative_tokens": 4,
                                          "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    proposer = NgramProposer(config)
    history = [1, 2, 3, 4, 5, 6, 7, 1, 2]

    def step(appended: list[int], scored: int) -> list[int]:
        nonlocal history
        history = history + appended
        return proposer.propose(ProposalBatch(["r"], np.array([history]), np.array([len(history)]),
                                              num_verified=np.array([scored])))[0]

    assert step([], 0) == [3, 4, 5, 6]
    # Unscored steps whose one token differs from the guess: nothing learnt, the drafts
    # are a fresh proposer's (full length, no lookup skipped).
    for token in (5, 1, 3, 7):
        draft = step([token], 0)
        fresh = NgramProposer(config).propose(ProposalBatch(["r"], np.array([history]), np.array([len(history)])))
        assert draft and draft == fresh[0]
    # Scored and rejected twice in a row: the lookups back off, as without async steps.
    history = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    proposer = NgramProposer(config)
    assert step([], 0)
    assert step([5], 4) and not step([1], 2)
    # Two of four scored and both kept: kept whole, the length stays 4.
    proposer = NgramProposer(config)
    history = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert step([], 0) == [3, 4, 5, 6]
    assert len(step([3, 4, 7], 2)) == 4


def _lookup_by_hand(history: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    # The definition, one window at a time: longest suffix first, latest occurrence first.
    length = len(history)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = history[length - n:]
        for start in range(length - 1 - n, -1, -1):
            if history[start:start + n] == suffix:
                return history[start + n:start + n + k]
    return []


def test_ngram_lookup_equals_its_definition() -> None:
    # Small vocabularies, so that suffixes repeat at every length.
    rng = np.random.RandomState(0)
    for _ in range(3000):
        history = rng.randint(0, rng.randint(1, 6), size=rng.randint(1, 40)).tolist()
        min_n = rng.randint(1, 4)
        max_n = rng.randint(min_n, 6)
        k = rng.randint(1, 6)
        got = propose_ngram(np.array(history, dtype=np.int64), min_n, max_n, k).tolist()
        assert got == _lookup_by_hand(history, min_n, max_n, k), (history, min_n, max_n, k)
