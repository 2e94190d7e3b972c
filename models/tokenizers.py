"""A character-level tokenizer for tiny models, built offline (no download), as a real `PreTrainedTokenizerFast`.

Tests and the tiny world need a tokenizer without the Hub; one token per printable ASCII character keeps
vocabularies small (~100 + specials) and makes rewards on text exact.
"""
from __future__ import annotations

import string
from typing import Sequence

from transformers import PreTrainedTokenizerFast

BASE_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>", "<mask>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def char_tokenizer(extra_special_tokens: Sequence[str] = (), *, chat_template: bool = True) -> PreTrainedTokenizerFast:
    """A char-level tokenizer: ids 0-4 are `<pad> <bos> <eos> <unk> <mask>`, then `extra_special_tokens` (each a
    single token, e.g. `<|image_pad|>`), then the printable ASCII characters (`\\n` and `\\t` included).

    With `chat_template`, `apply_chat_template` renders `<|role|>content\\n` lines (role markers are spelled out
    character by character) and `add_generation_prompt` appends `<|assistant|>`.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    specials = list(BASE_SPECIALS) + [t for t in extra_special_tokens if t not in BASE_SPECIALS]
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        mask_token="<mask>",
        additional_special_tokens=[t for t in specials if t not in BASE_SPECIALS],
    )
    if chat_template:
        out.chat_template = CHAT_TEMPLATE
    return out


def word_tokenizer(words: Sequence[str], extra_special_tokens: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over a closed vocabulary, as a real `PreTrainedTokenizerFast`: ids 0-4 are
    `<pad> <bos> <eos> <unk> <mask>`, then `extra_special_tokens`, then `words` (deduplicated, in order).

    Text splits on whitespace and punctuation (`\\w+` runs and runs of other non-space characters); a word outside the
    vocabulary becomes `<unk>`. Decoding joins words with spaces. For tiny-world prompts, whose vocabulary is a few
    dozen words: one token per word keeps prompts ~10 tokens long, where a char tokenizer needs ~60.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = list(BASE_SPECIALS) + [t for t in extra_special_tokens if t not in BASE_SPECIALS]
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(specials)}
    for w in words:
        if not isinstance(w, str) or not w or any(ch.isspace() for ch in w):
            raise ValueError(f"vocabulary words must be non-empty strings without whitespace, got {w!r}")
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # \w+ and [^\w\s]+ runs
    tok.decoder = decoders.WordPiece(prefix="##")  # joins with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        mask_token="<mask>",
        additional_special_tokens=[t for t in specials if t not in BASE_SPECIALS],
    )


def words_of(texts: Sequence[str]) -> list[str]:
    """The vocabulary of `texts` as `word_tokenizer` splits them, in first-seen order."""
    import re

    seen: dict[str, None] = {}
    for t in texts:
        for w in re.findall(r"\w+|[^\w\s]+", t):
            seen.setdefault(w, None)
    return list(seen)
