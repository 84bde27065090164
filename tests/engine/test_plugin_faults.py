"""A logits processor or proposer that breaks its contract fails the step naming itself
and what was expected, not with an error deep in the sampler or the verification."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from forkless import LLM, SamplingParams
from tests.engine.tiny_models import VOCAB_SIZE

PLUGINS = "tests.engine.probe_plugins"
PROMPTS = ["Hello there", "The quick brown fox"]


def _fails(llm: LLM, message: str) -> None:
    try:
        with pytest.raises(RuntimeError, match=re.escape(message)):
            llm.generate(PROMPTS, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), use_tqdm=False)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("name,got", [("ReturnsNone", "None"),
                                      ("ReturnsTenColumns", "a torch.float32 tensor of shape [2, 10]")])
def test_a_processor_returning_no_logits_of_the_input_shape_is_named(llama_dir: Path, name: str, got: str) -> None:
    # (None failed in the sampler's argmax without a name; ten columns sampled from ids 0-9.)
    llm = LLM(str(llama_dir), max_model_len=128, logits_processors=[f"{PLUGINS}:{name}"])
    _fails(llm, f"logits processor {PLUGINS}.{name} returned {got} from apply(): expected a float tensor "
                f"of the input's shape [2, {VOCAB_SIZE}]")


EXPECTED = f": expected one list of token ids in [0, {VOCAB_SIZE}) per request (2)"


@pytest.mark.parametrize("name,problem", [
    ("RaisingProposer", "raised RuntimeError: probe: proposer failed"),
    ("StringDrafts", "returned 'abc' for request '0'" + EXPECTED),
    ("OutOfVocabDrafts", "returned [1000000000] for request '0'" + EXPECTED),
    ("TooFewDrafts", "returned [[1]]" + EXPECTED),
])
def test_a_proposer_that_raises_or_returns_bad_drafts_is_named(llama_dir: Path, name: str, problem: str) -> None:
    llm = LLM(str(llama_dir), max_model_len=128,
              speculative_config={"method": f"{PLUGINS}:{name}", "num_speculative_tokens": 2})
    _fails(llm, f"speculative proposer {PLUGINS}.{name}: propose() {problem}")
