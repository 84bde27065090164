"""The ngram proposer, the proposer registry and ``--speculative-config`` parsing."""

from __future__ import annotations

import numpy as np
import pytest

from forkless.plugins import RegistryError
from forkless.spec_decode import ProposalBatch, Proposer, ProposerRegistry, SpeculativeConfig
from forkless.spec_decode import ngram
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
    # A new request's first draft is a probe: 1 token, after a 2-token suffix seen before
    # (row 2 would match nothing if the padding after its 4 tokens were read).
    out = proposer.propose(_batch([1, 2, 3, 1, 2], [9, 8, 9, 8], [5]))
    assert out == [[3], [9], []]


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
    # vLLM's other spelling of n-gram speculation: the "model" names the method.
    ngram = SpeculativeConfig.from_json({"model": "ngram", "num_speculative_tokens": 4})
    assert ngram == SpeculativeConfig.from_json({"method": "ngram", "num_speculative_tokens": 4})
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


def _ngram(k: int, max_n: int = 2) -> NgramProposer:
    return NgramProposer(SpeculativeConfig.from_json({"method": "ngram", "num_speculative_tokens": k,
                                                      "prompt_lookup_min": 1, "prompt_lookup_max": max_n}))


def _one(proposer: NgramProposer, rid: str, history: list[int], scored: int | None = None) -> list[int]:
    verified = None if scored is None else np.array([scored])
    return proposer.propose(ProposalBatch([rid], np.array([history]), np.array([len(history)]),
                                          num_verified=verified))[0]


def test_draft_length_maximises_the_expected_gain() -> None:
    # Token j of a draft is kept with chance p ** j and costs DRAFT_TOKEN_COST; a step
    # that verifies anything costs VERIFY_STEP_COST once. The length is the best one.
    def net(p: float, j: int) -> float:
        return sum(p**i for i in range(1, j + 1)) - j * ngram.DRAFT_TOKEN_COST - (j > 0) * ngram.VERIFY_STEP_COST

    for k in (1, 2, 4, 7):
        lengths = []
        for p in np.linspace(0.0, 1.0, 201):
            length = ngram.draft_length(float(p), k)
            assert net(p, length) == max(net(p, j) for j in range(k + 1)), (p, k)
            lengths.append(length)
        assert lengths == sorted(lengths) and lengths[0] == 0 and lengths[-1] == k
    # Rare guesses do not pay, likely ones pay in full.
    assert ngram.draft_length(0.1, 4) == 0 and ngram.draft_length(0.9, 4) == 4


def _kept_steps(proposer, steps: int) -> tuple[list[int], list[int]]:
    """``steps`` proposals for request "r" over text that repeats 1..6, a target keeping
    every draft whole (and adding its own next token): the draft lengths, the history."""
    history = [1, 2, 3, 4, 5, 6, 1, 2]
    lengths = []
    for _ in range(steps):
        draft = _one(proposer, "r", history)
        lengths.append(len(draft))
        history = history + draft + [(draft[-1] if draft else history[-1]) % 6 + 1]  # kept + its own
    return lengths, history


def test_ngram_stops_drafting_when_drafts_are_rejected() -> None:
    proposer = _ngram(k=4)
    # A new request's 1-token draft is kept, then it drafts at full length.
    lengths, history = _kept_steps(proposer, 6)
    assert lengths == [1, 4, 4, 4, 4, 4]
    # Now a target that always emits another token than the guess's first: the drafts
    # get shorter and stop; then only 1-token probes, at the steps that are multiples of
    # a backoff doubling from 1 to MAX_BACKOFF (after step 14, the last paying draft:
    # 18, 22 (2), 24 (4), 32 (8), 48 (16), 64 (32); steps 15-17 and 20 found no
    # 2-token suffix seen before).
    drafts = {}
    for step in range(6, 80):
        draft = _one(proposer, "r", history)
        if draft:
            drafts[step] = len(draft)
        history = history + [draft[0] % 6 + 1 if draft else 1]  # never the guess
    assert ngram.MAX_BACKOFF == 32
    assert list(drafts) == [6, 7, 8, 9, 10, 11, 12, 13, 14, 18, 22, 24, 32, 48, 64]
    assert [drafts[s] for s in (12, 13, 14, 18, 22, 24, 32, 48, 64)] == [2, 2, 1, 1, 1, 1, 1, 1, 1]


def test_ngram_keeps_drafting_while_drafts_are_kept() -> None:
    # A target that keeps every draft whole (the text repeats 1..6): a draft every step,
    # at full length from the second one.
    lengths, _ = _kept_steps(_ngram(k=4), 20)
    assert lengths[0] == 1 and set(lengths[1:]) == {4}  # a new request's first: 1 token


def test_ngram_probes_find_text_that_starts_to_repeat() -> None:
    proposer = _ngram(k=4)
    history = [5, 6, 7, 8, 9, 10, 1, 2, 3, 1, 2, 3, 1, 2]
    for _ in range(20):  # rejected: backed off
        draft = _one(proposer, "r", history)
        history = history + [draft[0] % 3 + 1 if draft else 1]
    assert sum(bool(_one(proposer, "r", history + [1] * i)) for i in range(8)) <= 1
    # From now on the text repeats 11..16 and the target keeps every draft: a kept probe
    # turns drafting back on.
    history = history + [11, 12, 13, 14, 15, 16] * 2
    lengths = []
    for _ in range(2 * ngram.MAX_BACKOFF):
        draft = _one(proposer, "r", history)
        lengths.append(len(draft))
        history = history + draft + [(draft[-1] if draft else history[-1]) % 6 + 11]
    assert lengths[-8:] == [4] * 8


def test_ngram_probes_need_a_two_token_suffix_and_fall_on_shared_steps() -> None:
    proposer = _ngram(k=2)
    histories = {"a": [1, 2, 3, 1, 2, 3, 1, 2], "b": [1, 2, 3, 1, 2, 3, 1, 2]}
    drafted: dict[str, list[int]] = {"a": [], "b": []}
    for step in range(70):
        ids = ["a"] if step < 5 else ["a", "b"]  # b arrives at step 5
        width = max(len(histories[r]) for r in ids)
        rows = np.zeros((len(ids), width), dtype=np.int64)
        for i, r in enumerate(ids):
            rows[i, : len(histories[r])] = histories[r]
        out = proposer.propose(ProposalBatch(ids, rows, np.array([len(histories[r]) for r in ids])))
        for r, draft in zip(ids, out):
            if draft:
                drafted[r].append(step)
            histories[r] = histories[r] + [draft[0] % 3 + 1 if draft else 1]
    # A new request probes at once (its first draft), then at multiples of its backoff,
    # doubling 2, 4, 8, ... after each probe (a at step 2 and b at 6 found no 2-token
    # suffix seen before: no probe spent): from step 16 on the same steps, one
    # verification for both.
    assert drafted["a"] == [0, 4, 8, 16, 32, 64]
    assert drafted["b"] == [5, 8, 12, 16, 32, 64]
    # A probe wants the last 2 tokens seen before; one that finds none is not spent.
    proposer = _ngram(k=2)
    history = [1, 2, 3, 1, 2, 3, 1, 2]
    assert _one(proposer, "r", history) == [3]  # step 0: a new request's probe ("1 2"); backoff 2
    history = history + [9, 5, 9]  # rejected
    assert not _one(proposer, "r", history)  # step 1: 1 is odd
    history = history + [5, 9]
    assert _one(proposer, "r", history) == [5]  # step 2: "5 9" occurred: a probe; backoff 4
    history = history + [1, 9, 5]  # rejected
    assert not _one(proposer, "r", history)  # step 3: not a multiple of 4
    history = history + [9]
    assert _one(proposer, "r", history) == [1]  # step 4: "5 9" -> 1; backoff 8
    history = history + [2, 5, 9]  # rejected
    assert not _one(proposer, "r", history)  # step 5: waits for step 8
    # Where "9" occurred before and "5 9" did not, a probe finds nothing and is not spent.
    proposer = _ngram(k=2)
    assert not _one(proposer, "r", [1, 9, 2, 5, 9])  # step 0: no 2-token match
    assert _one(proposer, "r", [1, 9, 2, 5, 9, 2, 5, 9]) == [2]  # step 1: backoff still 1


def test_ngram_state_is_per_request() -> None:
    proposer = _ngram(k=4)
    history = [1, 2, 3, 4, 5, 6, 1, 2]
    for _ in range(4):  # drafts kept whole: drafting at full length
        draft = _one(proposer, "r", history)
        history = history + draft + [(draft[-1] if draft else history[-1]) % 6 + 1]
    assert len(_one(proposer, "r", history)) == 4
    # A new request starts afresh: 1 token (and r, whose draft was never judged, keeps
    # its estimate).
    batch = ProposalBatch(["r", "s"], np.array([history, history[:8] + [0] * (len(history) - 8)]),
                          np.array([len(history), 8]))
    assert [len(d) for d in proposer.propose(batch)] == [4, 1]


def test_ngram_judges_only_the_drafts_a_step_scored() -> None:
    """A draft the step never scored (async scheduling ran the step before the draft was
    known, or the budget left no room) changes nothing; the scored part of a draft cut
    short by the scheduler, kept whole, shows no rejection."""
    text = list(range(1, 10)) * 3  # lookups find 4 tokens to guess

    def drafting(k4: NgramProposer) -> list[int]:
        """A new request whose first draft was kept: drafting at full length."""
        history = text[:20]
        assert _one(k4, "r", history, scored=0) == [3]  # a new request's: 1 token
        history = history + [3, 4]  # kept, then the target's own token
        assert _one(k4, "r", history, scored=1) == [5, 6, 7, 8]
        return history

    k4 = _ngram(k=4)
    history = drafting(k4)
    # Unscored steps whose one token differs from the guess: nothing learnt, the
    # request keeps drafting at full length. (Counted as rejections, the drafts would
    # shrink at once and stop at the third.)
    for token in (9, 1, 5, 8):
        history = history + [token]
        assert len(_one(k4, "r", history, scored=0)) == 4
    # Scored and rejected three times in a row: shorter drafts, then none (only probes,
    # which need a 2-token suffix seen before: "8 7" is not, though "7" is).
    k4 = _ngram(k=4)
    history = drafting(k4) + [2, 7, 1, 8, 7]
    assert len(_one(k4, "r", history[:-4], scored=4)) == 2  # guess 5 6 7 8, the target 2
    assert len(_one(k4, "r", history[:-3], scored=2)) == 1  # guess 3 4, the target 7
    assert not _one(k4, "r", history, scored=1)  # guess 8, the target 1
    # One of two scored and kept: no rejection seen, so the estimate rises to full length
    # (had the unscored token counted as rejected, 3).
    k4 = _ngram(k=4)
    history = drafting(k4) + [2]
    assert _one(k4, "r", history, scored=4) == [3, 4]  # rejected once: 2 tokens
    assert len(_one(k4, "r", history + [3, 9, 1, 2], scored=1)) == 4


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
