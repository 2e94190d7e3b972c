"""A tiny offline `CLIPTokenizer` (the tokenizer class of aMUSEd, `amused/amused-256/tokenizer/`), built from a
vocabulary in code: no download.

CLIP's tokenizer is byte-level BPE: a word is split into byte symbols, its last symbol carries the `</w>` end-of-word
marker, and ranked merges join symbols. Here the base vocabulary is the 256 byte symbols with and without `</w>`,
and every word of `words` gets the chain of merges that joins it into one token (`c1 c2 -> c1c2`, `c1c2 c3 -> ...`),
so known words are one token each and anything else falls back to bytes. Shapes: a prompt becomes
`<|startoftext|> word ... <|endoftext|>` padded with `<|endoftext|>` to `model_max_length` (CLIP's padding).
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Sequence

SPECIALS = ("<|startoftext|>", "<|endoftext|>")


@lru_cache(maxsize=1)
def byte_symbols() -> tuple[str, ...]:
    """The 256 printable stand-ins of the bytes 0..255 (GPT-2 / CLIP `bytes_to_unicode`), in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return tuple(out[b] for b in range(256))


def word_merges(word: str) -> list[tuple[str, str]]:
    """The left-to-right merges that join `word` (lower-case, no spaces) into the one symbol `word</w>`."""
    sym = byte_symbols()
    parts = [sym[b] for b in word.encode("utf-8")]
    if not parts:
        return []
    parts[-1] = parts[-1] + "</w>"
    out, acc = [], parts[0]
    for p in parts[1:]:
        out.append((acc, p))
        acc = acc + p
    return out


def tiny_clip_tokenizer(words: Sequence[str] = (), *, model_max_length: int = 16):
    """A `transformers.CLIPTokenizer` whose vocabulary is the byte symbols, `words` as whole tokens and CLIP's
    specials (`<|startoftext|>` = BOS, `<|endoftext|>` = EOS and pad); `model_max_length` is the padded length."""
    from transformers import CLIPTokenizer

    if not isinstance(model_max_length, int) or model_max_length < 3:
        raise ValueError(f"model_max_length must be an int >= 3 (BOS, a token, EOS), got {model_max_length!r}")
    sym = byte_symbols()
    vocab: dict[str, int] = {}
    for s in list(sym) + [s + "</w>" for s in sym]:
        vocab.setdefault(s, len(vocab))
    merges: list[tuple[str, str]] = []
    seen = set()
    for w in sorted({w.lower() for w in words if w}):
        if not re.fullmatch(r"[a-z0-9]+", w):
            raise ValueError(f"words must be lower-case letters and digits only, got {w!r}")
        for a, b in word_merges(w):
            if (a, b) not in seen:
                seen.add((a, b))
                merges.append((a, b))
                vocab.setdefault(a + b, len(vocab))
    for s in SPECIALS:
        vocab[s] = len(vocab)
    tok = CLIPTokenizer(vocab=vocab, merges=merges)
    tok.model_max_length = model_max_length
    return tok


def words_of(texts: Sequence[str]) -> list[str]:
    """The distinct lower-case words of `texts` (CLIP lower-cases and splits on non-letters)."""
    return sorted({w for t in texts for w in re.findall(r"[a-z0-9]+", t.lower())})
