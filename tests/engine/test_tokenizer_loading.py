"""The API server loads the tokenizer of a built-in model type by its class name,
without ``AutoTokenizer`` (forkless/tokenizers/loading.py): the same class, tokens, text
and chat prompt as ``AutoTokenizer`` gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from forkless.tokenizers.loading import direct_tokenizer_class_name, load_tokenizer
from tests.engine.tiny_models import save_tokenizer

TEXT = "Paris is the capital of France. <|im_start|> ünïcödé 東京 \n\n  spaces"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    save_tokenizer(folder)
    return folder


def _folder(tmp_path: Path, files: Path, model_type: str, tokenizer_class: str, **extra: object) -> Path:
    for f in files.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.update(tokenizer_class=tokenizer_class, **extra)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return tmp_path


def _same(ours, reference) -> None:
    assert type(ours) is type(reference)
    ids = reference.encode(TEXT)
    assert ours.encode(TEXT) == ids
    assert ours.decode(ids) == reference.decode(ids)
    assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
    assert ours.convert_ids_to_tokens(ids) == reference.convert_ids_to_tokens(ids)
    assert (ours.eos_token_id, ours.bos_token_id, ours.pad_token_id) == (
        reference.eos_token_id, reference.bos_token_id, reference.pad_token_id)
    assert ours.all_special_ids == reference.all_special_ids
    assert ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == \
        reference.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)


CLASSES = ["PreTrainedTokenizerFast", "GPT2Tokenizer", "GPT2TokenizerFast", "Qwen2Tokenizer", "Qwen2TokenizerFast",
           "TokenizersBackend"]
DIRECT = [("llama", c) for c in CLASSES] + [("qwen3", c) for c in CLASSES] + [
    ("qwen2", "Qwen2Tokenizer"), ("qwen2", "Qwen2TokenizerFast")]


@pytest.mark.parametrize("model_type,tokenizer_class", DIRECT)
def test_named_class_equals_autotokenizer(tmp_path: Path, tokenizer_files: Path, model_type: str,
                                          tokenizer_class: str) -> None:
    folder = _folder(tmp_path, tokenizer_files, model_type, tokenizer_class)
    assert direct_tokenizer_class_name(folder) == tokenizer_class
    _same(load_tokenizer(folder), AutoTokenizer.from_pretrained(folder))


@pytest.mark.parametrize("model_type,tokenizer_class,extra", [
    ("mistral", "PreTrainedTokenizerFast", {}),      # Mistral's tekken check is AutoTokenizer's
    ("llama", "LlamaTokenizerFast", {}),             # as is Llama's SentencePiece / ByteLevel choice
    ("qwen2", "PreTrainedTokenizerFast", {}),        # and Qwen2's own class over the hub's
    ("qwen3", "Qwen2Tokenizer", {"auto_map": {"AutoTokenizer": [None, "x.Y"]}}),  # custom code
])
def test_other_folders_go_to_autotokenizer(tmp_path: Path, tokenizer_files: Path, model_type: str,
                                           tokenizer_class: str, extra: dict) -> None:
    assert direct_tokenizer_class_name(_folder(tmp_path, tokenizer_files, model_type, tokenizer_class,
                                               **extra)) is None


def test_the_default_model_loads_directly_without_torch() -> None:
    """The default model's folder (SmolLM2: GPT2Tokenizer, llama): no torch, no auto classes."""
    from forkless.model_loader.default_model import default_model_path

    folder = default_model_path()
    assert direct_tokenizer_class_name(folder) is not None
    code = ("import sys; from forkless.tokenizers.loading import load_tokenizer; "
            f"tok = load_tokenizer({str(folder)!r}); "
            "print(type(tok).__name__, 'torch' in sys.modules, "
            "'transformers.models.auto.tokenization_auto' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["False", "False"], proc.stdout
    _same(load_tokenizer(folder), AutoTokenizer.from_pretrained(folder))
