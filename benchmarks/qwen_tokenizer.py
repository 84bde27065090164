"""A Qwen2/Qwen3 tokenizer folder, built from the BPE ranks that PyPI's ``dashscope`` ships.

Nothing here can reach a model hub, and a word-level tokenizer (``forkless.bench.shapes``)
or the default model's 49,152 tokens is not what a grammar walks over with a Qwen3 model:
structured outputs' per-token costs depend on the vocabulary. ``dashscope`` (Alibaba's
SDK, a pure-Python wheel) carries ``qwen.tiktoken``, the 151,643 byte-level BPE tokens that
Qwen2 and Qwen3 use. This script downloads that wheel (``pip download --no-deps``, into
the folder it writes), turns the ranks into a ``tokenizers`` BPE (vocabulary + the merges
that rebuild each token, the split regex and byte-level mapping of Qwen2's
``tokenizer.json``), adds Qwen3's 26 special tokens (151,643-151,668) and a ChatML chat
template, and writes ``tokenizer.json``, ``tokenizer_config.json`` and a ``config.json``
holding only the EOS id:

    python benchmarks/qwen_tokenizer.py OUT_DIR
    python benchmarks/structured_outputs.py --shape qwen3-0.6b --tokenizer-from OUT_DIR ...

Not Qwen3's released file (that one is not on this machine), but the same tokens, ids,
pre-tokenization and specials: encoding ordinary text gives the ids Qwen3 would.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import zipfile
from pathlib import Path

# Qwen2's pre-tokenizer (its tokenizer.json's Split pattern).
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
# Qwen3's added tokens, from id 151643 on (those marked special are skipped when decoding).
SPECIALS = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
            ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
            ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True),
            ("<|vision_end|>", True), ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
            ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
            ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
            ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False)]
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")
EOS_ID = 151645  # <|im_end|>, Qwen3's instruct EOS


def byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies hold)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def merges_of(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge that makes each multi-byte token, in rank order: byte-pair encoding of the
    token's bytes with only lower-ranked merges ends in exactly two parts."""
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def fetch_ranks(out: Path) -> dict[bytes, int]:
    """``qwen.tiktoken`` from the dashscope wheel (downloaded into ``out`` once)."""
    wheels = sorted(out.glob("dashscope-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(out), "dashscope"],
                       check=True)
        wheels = sorted(out.glob("dashscope-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        text = wheel.read("dashscope/resources/qwen.tiktoken").decode()
    ranks = {}
    for line in text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def write_folder(out: Path) -> Path:
    """Write the tokenizer folder (see the module docstring); returns it."""
    out.mkdir(parents=True, exist_ok=True)
    ranks = fetch_ranks(out)
    chars = byte_chars()

    def text(token: bytes) -> str:
        return "".join(chars[b] for b in token)

    vocab = {text(t): r for t, r in ranks.items()}
    added = [{"id": len(ranks) + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": special} for i, (c, special) in enumerate(SPECIALS)]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[text(a), text(b)] for a, b in merges_of(ranks)]},
    }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2TokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "unk_token": None, "model_max_length": 131072, "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added}}))
    # model_type: transformers checks local folders without one for a Mistral regex bug.
    (out / "config.json").write_text(json.dumps({"model_type": "qwen3", "eos_token_id": EOS_ID}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the folder to write")
    args = parser.parse_args()
    out = write_folder(args.out)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    sample = "Hello, world! {\"readings\": [12, 345]}"
    ids = tok.encode(sample).ids
    assert tok.decode(ids) == sample, (ids, tok.decode(ids))
    print(f"{out}: {tok.get_vocab_size()} tokens; {sample!r} -> {ids}")


if __name__ == "__main__":
    main()
