"""Loading a served model's tokenizer without ``AutoTokenizer`` where that is safe.

Invariants:
    * ``AutoTokenizer`` imports transformers' auto-model machinery, and with it torch,
      ``torch._dynamo`` and more: ~11 s of the API server's start on the H200, in
      parallel with the worker's own start but longer than it. For the tokenizer classes
      that :data:`_DIRECT` lists for a model type, named by ``tokenizer_config.json``,
      ``AutoTokenizer`` loads exactly the named class (its model-type overrides concern
      other cases: Llama's SentencePiece class, Mistral's tekken, Qwen2 checkpoints whose
      hub class it distrusts); :func:`load_tokenizer` then names that class itself, which
      imports only the tokenizer's own module. tests/engine/test_tokenizer_loading.py checks that both give
      the same class and the same tokens, text and chat prompt.
    * Everything else -- custom code (``auto_map``), another class or model type, a folder
      without ``tokenizer.json`` -- goes to ``AutoTokenizer``, unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_BYTE_LEVEL_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend", "GPT2Tokenizer",
                                 "GPT2TokenizerFast", "Qwen2Tokenizer", "Qwen2TokenizerFast"})
# model_type -> the tokenizer classes loaded by name (what the tests compare).
_DIRECT: dict[str, frozenset[str]] = {
    "llama": _BYTE_LEVEL_CLASSES,
    "qwen3": _BYTE_LEVEL_CLASSES,
    "qwen2": frozenset({"Qwen2Tokenizer", "Qwen2TokenizerFast"}),  # others become Qwen2Tokenizer
}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def direct_tokenizer_class_name(folder: str | Path) -> str | None:
    """The class :func:`load_tokenizer` names itself for ``folder``, or ``None`` when the
    folder goes to ``AutoTokenizer``."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        return None
    tok_config = _read_json(folder / "tokenizer_config.json")
    name = tok_config.get("tokenizer_class")
    model_type = _read_json(folder / "config.json").get("model_type")
    if "auto_map" in tok_config or name not in _DIRECT.get(model_type, ()):
        return None
    return name


def load_tokenizer(folder: str | Path) -> Any:
    """The tokenizer ``AutoTokenizer.from_pretrained(folder)`` gives, loaded faster where
    that is known to be the same (see the module's invariants).

    Args:
        folder: A local model or tokenizer folder (what ``--tokenizer`` names).
    """
    name = direct_tokenizer_class_name(folder)
    if name is not None:
        import transformers

        # As AutoTokenizer: the fast variant when there is one (transformers 4 has both;
        # in 5 the Fast names are aliases).
        cls = None if name.endswith("Fast") else getattr(transformers, name + "Fast", None)
        cls = cls or getattr(transformers, name, None)
        if cls is not None:
            return cls.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
