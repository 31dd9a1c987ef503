"""Each benchmark's own prompt, built as its released evaluation code builds it.

A model is scored on the wording its benchmark gives it, so these templates are the benchmarks'
own, typos and spacing included:

- StreamingBench (THUNLP-MT/StreamingBench): `src/benchmark/StreamingBench.py` (real-time and
  omni-source questions), `StreamingBenchSQA.py` (sequential questions, with the earlier questions
  and their answers as context) and `StreamingBenchProactive.py` (proactive output: a yes/no poll,
  then the question).
- OVO-Bench (JoeLeelyf/OVO-Bench): `constant.py`, filled as `utils/OVOBench.py`'s `build_prompt`.
- Video-MME and MVBench as lmms-eval runs them (EvolvingLMMs-Lab/lmms-eval 0.7.3):
  `lmms_eval/tasks/videomme/utils.py` `videomme_doc_to_text` with `videomme.yaml`'s default
  post-prompt, and `lmms_eval/tasks/mvbench/utils.py` `mvbench_doc_to_text` with the post-prompt of
  the `mvbench_*.yaml` tasks. Their `until` (the few-shot delimiter "\\n\\n", as they set
  none) is not applied: lmms-eval's model classes for these backbones do not cut the generated
  text there (`Llava_OneVision` drops `until`; the Qwen2.5-VL, Qwen3-VL and Qwen3.5 chat classes,
  which lmms-eval picks first, apply none, and their simple classes remove "\\n\\n" from it).

The engine strips a question of its surrounding whitespace, so a template's leading or trailing
newline does not reach the model, here or in lmms-eval through the plugin.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

LETTERS = string.ascii_uppercase

# -- StreamingBench ---------------------------------------------------------------------------------

_SB_CHOICE = (
    "You are an advanced video question-answering AI assistant. You have been provided with some frames from "
    "the video and a multiple-choice question related to the video. Your task is to carefully analyze the video "
    "and provide the best answer to question, choosing from the four options provided. Respond with only the "
    "letter (A, B, C, or D) of the correct option.\n\nQuestion: {}\n\nOptions:\n{}\n{}\n{}\n{}"
)
_SB_SQA = (
    "You are an advanced video question-answering AI assistant. You have been provided with a video and a "
    "multiple-choice question related to the video. Your task is to carefully analyze the video and the provided "
    "context to answer the question, choosing from the four options provided. Respond with only the letter (A, B, "
    "C, or D) of the correct option.\n\n{}\n\nHere is the question. Answer it and don't confuse it with the "
    "previous conversation.\nQuestion: {}\n\nOptions:\n{}\n{}\n{}\n{}\n\nThe best option is:"
)
_SB_SQA_CONTEXT_START = (
    "Here are the contextual information related to the video. Please answer the questions based on the "
    "contextual information: "
)
_SB_PROACTIVE = (
    "You are an advanced image question-answering AI assistant. You have been provided with images and a question "
    "related to the images. Your task is to carefully analyze the images and provide the answer to the question. "
    "You need to carefully confirm whether the images content meet the conditions of the question, and then output "
    "the correct content.\n\nQuestion: {}\n\nThe answer is:\n"
)
SB_OPTIONS = 4  # the templates show four options; a fifth or later entry of the list is never shown


def streamingbench_options(options: Sequence[str]) -> list[str]:
    """The four option lines StreamingBench shows: as given when the first starts with "A.", else
    the first four lettered "A. " to "D. " (`StreamingBenchEval`)."""
    shown = [str(o) for o in options[:SB_OPTIONS]]
    if shown[0].startswith("A."):
        return shown
    return [f"{LETTERS[i]}. {o}" for i, o in enumerate(shown)]


def streamingbench_prompt(question: str, options: Sequence[str]) -> str:
    """A real-time or omni-source question (`StreamingBench.py`: PROMPT_TEMPLATE + "The best option is:")."""
    return _SB_CHOICE.format(question, *streamingbench_options(options)) + "\n\nThe best option is:"


def streamingbench_sqa_prompt(context: str, question: str, options: Sequence[str]) -> str:
    """A sequential question, after the context of the video's earlier questions (`StreamingBenchSQA.py`)."""
    return _SB_SQA.format(context, question, *streamingbench_options(options))


def streamingbench_sqa_context(
    context: str, time_stamp: str, question: str, options: Sequence[str], answer: str
) -> str:
    """The context after one more sequential question: its question, options and right answer
    (`StreamingBenchSQAEval` appends them, whatever the model answered)."""
    shown = streamingbench_options(options)
    return (
        (context or _SB_SQA_CONTEXT_START)
        + f"At timestamp {time_stamp}, the following question and answer occurred: Question: {question}; "
        + f"Options: {shown[0]}, {shown[1]}, {shown[2]}, {shown[3]}; Answer: {answer}; "
    )


def proactive_poll_prompt(question: str, output: str) -> str:
    """The yes/no question a proactive task asks every second (`StreamingBenchProactiveEval`)."""
    query = f'{question} Is it the right time to output "{output}"? You can only answer yes or no.'
    return _SB_PROACTIVE.format(query)


def proactive_answer_prompt(question: str) -> str:
    """The question itself, asked once the poll says yes."""
    return _SB_PROACTIVE.format(question)


# -- OVO-Bench ------------------------------------------------------------------------------------

_OVO_CHOICE = (
    "\nQuestion: {}\nOptions:\n{}\n\nRespond only with the letter corresponding to your chosen option (e.g., A, B, C). "
    "\nDo not include any additional text or explanation in your response.\n"
)
# The forward tasks' prompts. REC's {} is "How many times did they ACTIVITY?", SSR's the step,
# CRR's the question.
OVO_FORWARD_PROMPTS = {
    "REC": (
        "\nYou're watching a video in which people may perform a certain type of action repetively. \n"
        "The person performing this kind of action are referred to as 'they' in the following statement.\n"
        "You're task is to count how many times have different people in the video perform this kind of action "
        "in total.\nOne complete motion counts as one. \nNow, answer the following question: {}\n"
        "Provide your answer as a single number (e.g., 0, 1, 2, 3…) indicating the total count.\n"
        "Do not include any additional text or explanation in your response.\n"
    ),
    "SSR": (
        "\nYou're watching a tutorial video which contain a sequential of steps. \n"
        "The following is one step from the whole procedures: \n{}\n"
        "Your task is to determine if the man or woman in the video is currently performing this step.\n"
        "Answer only with “Yes” or “No”.\n"
        "Do not include any additional text or explanation in your response.\n"
    ),
    "CRR": (
        "\nYou're responsible of answering questions based on the video content. \n"
        "The following question are relevant to the latest frames, i.e. the end of the video.\n{}\n"
        "Decide whether existing visual content, especially latest frames, i.e. frames that near the end of the "
        "video, provide enough information for answering the question.\nAnswer only with “Yes” or “No”.\n"
        "Do not include any additional text or explanation in your response.\n"
    ),
}


def ovo_choice_prompt(question: str, options: Sequence[str]) -> str:
    """A backward or real-time question: the options on one line, "A. x; B. y;" (`build_prompt`)."""
    return _OVO_CHOICE.format(question, "; ".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options)) + ";")


def ovo_forward_prompt(task: str, filler: str) -> str:
    """A forward test point's prompt (REC, SSR or CRR)."""
    return OVO_FORWARD_PROMPTS[task].format(filler)


# -- lmms-eval's Video-MME and MVBench ------------------------------------------------------------------

_VIDEOMME_INSTRUCTION = (
    "Select the best answer to the following multiple-choice question based on the video and the subtitles. "
    "Respond with only the letter (A, B, C, or D) of the correct option."
)
_VIDEOMME_POST = "\nAnswer with the option's letter from the given choices directly."
_MVBENCH_POST = "Only give the best option.\n"


def videomme_prompt(question: str, options: Sequence[str]) -> str:
    """A Video-MME question: the options as the file writes them ("A. ..."), one per line."""
    return _VIDEOMME_INSTRUCTION + "\n" + question + "\n" + "\n".join(options) + "\n" + _VIDEOMME_POST


def mvbench_prompt(question: str, candidates: Sequence[str]) -> str:
    """An MVBench question: "Question:" and the candidates as "(A) ..." lines."""
    lines = "".join(f"({LETTERS[i]}) {c}\n" for i, c in enumerate(candidates))
    return "Question:" + question + "\nOption:\n" + lines + _MVBENCH_POST
