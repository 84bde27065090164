"""Acceptance: the embedded SmolLM2-135M-Instruct, converted from its Q4_1 GGUF, works.

Slow (the conversion takes ~10 s, once per session) but part of the default run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from forkless.model_loader.default_model import default_gguf_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(smollm2_folder: Path) -> tuple[Path, torch.nn.Module, object]:
    folder = smollm2_folder
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), \
        AutoTokenizer.from_pretrained(folder)


def test_answers_the_capital_of_france(smollm2) -> None:  # type: ignore[no-untyped-def]
    _, model, tokenizer = smollm2
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    output = model.generate(**inputs, max_new_tokens=30, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_config_is_smollm2_135m(smollm2) -> None:  # type: ignore[no-untyped-def]
    folder, _, _ = smollm2
    config = json.loads((folder / "config.json").read_text())
    expected = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "vocab_size": 49152, "max_position_embeddings": 8192, "rope_theta": 100000.0,
        "rms_norm_eps": 1e-05, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    }
    assert {k: config[k] for k in expected} == expected


def test_tokenizer_matches_the_original(smollm2) -> None:  # type: ignore[no-untyped-def]
    _, _, tokenizer = smollm2
    # The original tokenizer splits digits one by one (llama.cpp pre-tokenizer "smollm").
    assert tokenizer.tokenize("12345") == ["1", "2", "3", "4", "5"]
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    assert tokenizer.eos_token == "<|im_end|>"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_weights_equal_transformers_own_gguf_loading(smollm2) -> None:  # type: ignore[no-untyped-def]
    """transformers' GGUF path (dequantize + un-permute) is an independent reference."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    _, model, _ = smollm2
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(model.config)
    theirs = load_gguf_checkpoint(str(default_gguf_path()), return_tensors=True, model_to_load=skeleton)["tensors"]
    ours = model.state_dict()
    assert set(theirs) <= set(ours) and len(theirs) >= len(ours) - 1  # lm_head is tied
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name], tensor.float(), rtol=0, atol=0, msg=name)


def test_cached_resolution_does_not_import_torch(smollm2_folder: Path) -> None:
    """The API server resolves the model too; a cache hit must stay import-light."""
    code = ("import sys; from forkless.model_loader.default_model import resolve_model_path; "
            "print(resolve_model_path(None)); print(sorted({'torch', 'transformers', 'gguf'} & set(sys.modules)))")
    env = {**os.environ, "FORKLESS_CACHE_ROOT": str(smollm2_folder.parent.parent)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    folder, imported = result.stdout.strip().splitlines()
    assert Path(folder) == smollm2_folder
    assert imported == "[]"
