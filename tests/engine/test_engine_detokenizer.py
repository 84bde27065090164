"""Incremental detokenization matches a full decode, multi-byte characters included."""

from __future__ import annotations

from transformers import AutoTokenizer

from forkless.engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 and emoji \U0001f600\U0001f680!",
    " leading space, then   several spaces",
]


def test_token_by_token_text_equals_full_decode(llama_dir) -> None:
    tok = AutoTokenizer.from_pretrained(llama_dir)
    for text in TEXTS:
        ids = tok.encode(text)
        detok = IncrementalDetokenizer(tok, tok.encode("Prompt:"), skip_special_tokens=True)
        pieces = [detok.update([i]) for i in ids]
        assert "".join(pieces) == text and detok.num_chars == len(text)
        assert all("\ufffd" not in p for p in pieces)  # never a half character


def test_special_tokens_are_skipped_or_kept(llama_dir) -> None:
    tok = AutoTokenizer.from_pretrained(llama_dir)
    ids = tok.encode("Hello") + [tok.convert_tokens_to_ids("<|im_end|>")] + tok.encode(" world")
    skip = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    keep = IncrementalDetokenizer(tok, [], skip_special_tokens=False)
    assert "".join(skip.update([i]) for i in ids) == "Hello world"
    assert "".join(keep.update([i]) for i in ids) == "Hello<|im_end|> world"


class _SlowView:
    """The same tokenizer as a transformers tokenizer without a Rust backend presents itself."""

    is_fast = False

    def __init__(self, tok) -> None:
        self._tok = tok

    def __getattr__(self, name: str):
        return getattr(self._tok, name)


def test_both_paths_give_the_same_text(llama_dir) -> None:
    # Fast tokenizers stream through tokenizers' DecodeStream; others take the
    # decode-the-window path. Both must give a full decode's text, piece for piece.
    tok = AutoTokenizer.from_pretrained(llama_dir)
    for text in TEXTS:
        ids = tok.encode(text)
        pieces = {}
        for view in (tok, _SlowView(tok)):
            detok = IncrementalDetokenizer(view, tok.encode("Prompt:"), skip_special_tokens=True)
            assert (detok._backend is None) == (view is not tok)
            pieces[view is tok] = [detok.update([i]) for i in ids]
        assert "".join(pieces[True]) == "".join(pieces[False]) == text


def test_several_tokens_at_once_give_the_same_text(llama_dir) -> None:
    tok = AutoTokenizer.from_pretrained(llama_dir)
    for text in TEXTS:
        ids = tok.encode(text)
        for view in (tok, _SlowView(tok)):
            detok = IncrementalDetokenizer(view, tok.encode("Prompt:"), skip_special_tokens=True)
            assert detok.update(ids[:3]) + detok.update(ids[3:]) == text


def test_spaces_between_special_tokens_on_the_slow_path(llama_dir) -> None:
    # As transformers' and vLLM's slow detokenization: the text around a kept added token
    # is decoded on its own and the pieces joined by a space, unless the request says
    # spaces_between_special_tokens=False. A fast tokenizer's decoder has no such option.
    tok = AutoTokenizer.from_pretrained(llama_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("Hello") + [end, end] + tok.encode(" world")
    prompt = [end] + tok.encode("Prompt:")

    def text(view, **kwargs) -> str:
        detok = IncrementalDetokenizer(view, prompt, skip_special_tokens=False, **kwargs)
        return "".join(detok.update([i]) for i in ids)

    assert text(_SlowView(tok)) == "Hello <|im_end|> <|im_end|>  world"
    assert text(_SlowView(tok), spaces_between_special_tokens=False) == "Hello<|im_end|><|im_end|> world"
    assert text(tok) == text(tok, spaces_between_special_tokens=False) == "Hello<|im_end|><|im_end|> world"
