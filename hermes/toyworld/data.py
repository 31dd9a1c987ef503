"""Training data: streams of the toy world with questions cut at chunk ends, packed for one forward pass.

A training stream is laid out exactly as the engine lays out a stream with the full cache: the chat
prefix, then each chunk's frames (4 tokens each) and its newline token, at consecutive positions.
Many questions share one pass over the stream: each is appended after the whole stream, at the
positions it would have right after its chunk, and a block mask lets it see only the prefix, the
chunks up to its cut and its own tokens. So every question sees exactly what it would see asked
from the engine's full cache at that moment, and one pass of the video serves them all. The loss
is on the answer word and the end of turn after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hermes.models.base import VideoLM
from hermes.models.llava_onevision import SIGLIP_NORM
from hermes.toyworld.model import frame_tokens
from hermes.toyworld.questions import (
    RECALL,
    SIDES,
    Question,
    backward,
    is_there,
    never_seen,
    real_time,
)
from hermes.toyworld.world import COLOURS, SHAPES, Clip, WorldSpec, make_clip

# How often each kind of training question is drawn (relative weights).
TASK_WEIGHTS: dict[str, float] = {
    "OJR": 1.0,
    "ATR": 1.5,
    "STU": 1.0,
    "SSR": 1.5,
    "EPM": 2.0,
    "HLD": 2.0,
    "HLD-never": 0.5,
}
CHUNKS = (2, 4, 4, 8)  # frames per chunk a training stream is cut into (the app and benchmark use 4)
SPELLING_RATE = 0.2  # share of questions spelt "color", and share starting in lower case


def world_for(frames: int) -> WorldSpec:
    """The world of clips `frames` steps long: the held-out world's visits for 24 steps and more,
    fewer and shorter ones for the short clips a curriculum starts with."""
    if frames >= 24:
        return WorldSpec(frames=frames)
    stay = max(2, min(8, frames // 3))
    visits = max(1, min(4, frames // stay))
    return WorldSpec(
        frames=frames,
        min_visits=max(1, visits - 1),
        max_visits=visits,
        min_stay=max(1, stay // 2),
        max_stay=stay,
        max_gap=min(3, max(0, frames // 6)),
    )


@dataclass
class Stream:
    """A training clip cut into chunks of `chunk` frames, with its questions."""

    clip: Clip
    chunk: int
    questions: list[Question] = field(default_factory=list)


def cuts(frames: int, chunk: int) -> list[int]:
    """Steps seen at each chunk end (the last chunk may be short)."""
    ends = list(range(chunk, frames + 1, chunk))
    return ends if ends and ends[-1] == frames else [*ends, frames]


def draw_question(clip: Clip, task: str, at: int, rng: np.random.Generator) -> Question | None:
    """A question of `task` asked after `at` steps, or None when the clip offers none then."""
    if task in ("OJR", "ATR", "STU"):
        return real_time(clip, task, at, rng)
    if task == "SSR":
        return is_there(clip, at, rng)
    if task == "HLD-never":
        return never_seen(clip, at, rng)
    pool = [q for q in backward(clip, at, rng) if q.task == task]
    return pool[int(rng.integers(len(pool)))] if pool else None


def sample_stream(seed: int, frames: int, n_questions: int, weights: dict[str, float] = TASK_WEIGHTS) -> Stream:
    """The training stream of `seed`: its clip, chunking and questions, all fixed by the seed."""
    return sampled(make_clip(seed, world_for(frames)), seed, frames, n_questions, weights, draw_question)


def sampled(
    clip: Any,
    seed: int,
    frames: int,
    n_questions: int,
    weights: dict[str, float],
    draw: Callable[[Any, str, int, np.random.Generator], Question | None],
) -> Stream:
    """A training stream of `clip` (of either world), its chunking and questions drawn by `draw` with
    the tasks' `weights`, from the generator of `seed`."""
    rng = np.random.default_rng(seed)
    stream = Stream(clip, int(rng.choice(CHUNKS)))
    ends = cuts(frames, stream.chunk)
    tasks, p = list(weights), np.asarray(list(weights.values()))
    for _ in range(20 * n_questions):
        if len(stream.questions) == n_questions:
            break
        q = draw(clip, tasks[int(rng.choice(len(tasks), p=p / p.sum()))], int(rng.choice(ends)), rng)
        if q is not None:
            stream.questions.append(q)
    return stream


def surface(text: str, rng: np.random.Generator | None) -> str:
    """The question as a person might type it: sometimes "color", sometimes in lower case (as
    written when there is no `rng`)."""
    if rng is None:
        return text
    if rng.random() < SPELLING_RATE:
        text = text.replace("colour", "color")
    if rng.random() < SPELLING_RATE:
        text = text[0].lower() + text[1:]
    return text


@dataclass
class Batch:
    """Streams packed for one forward pass: (B, L) ids, positions and mask groups; the video slots'
    feature rows; and, per scored token, where it is and what it should be."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor  # (B, 1, L, L) bool, True where a token may attend
    pixels: torch.Tensor  # (frames, 3, H, W), every stream's frames in order
    video_rows: torch.Tensor  # (n_video,) row of each video slot in [frame tokens..., newline]
    targets: torch.Tensor  # (n_targets, 3): batch row, position, target id
    answers: list[Question]  # for each one-word answer's target, its question
    answer_targets: torch.Tensor  # (n_answers,) index into targets of each one-word answer
    frame_labels: torch.Tensor  # (frames, k): what each frame shows, as the Packer's `labels` give it
    sequences: list[tuple[Question, list[int]]] = field(default_factory=list)  # many-word answers' targets


class Packer:
    """Turns streams into a Batch for one backbone adapter (its prompt layout and tokenizer); `labels`
    gives the frame probe's classes of a clip's step (the first world's `frame_label` by default)."""

    def __init__(self, lm: VideoLM, labels: Callable[[Clip, int], tuple[int, ...]] | None = None) -> None:
        self.lm = lm
        self.labels = labels or frame_label
        self.per_frame = frame_tokens(lm.model.config)
        self.prefix = lm.prefix_ids()[0].tolist()
        self.video_id = int(lm.model.config.video_token_id)
        self.eos = int(lm.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.pad = int(lm.tokenizer.pad_token_id)
        self._questions: dict[str, list[int]] = {}

    def question_ids(self, text: str) -> list[int]:
        if text not in self._questions:
            self._questions[text] = self.lm.question_ids(text)[0].tolist()
        return self._questions[text]

    def answer_id(self, word: str) -> int:
        return int(self.lm.tokenizer.convert_tokens_to_ids(word))

    def answer_ids(self, answer: str) -> list[int]:
        """The ids of an answer's words (the word-level tokenizer's tokens, separated by spaces)."""
        return [self.answer_id(w) for w in answer.split()]

    def pixels(self, frames: np.ndarray) -> torch.Tensor:
        """The processor's pixel values of frames (F, H, W, 3), as `chunk_inputs` makes them."""
        out = self.lm.processor.video_processor(
            videos=[list(frames)], image_mean=SIGLIP_NORM, image_std=SIGLIP_NORM, return_tensors="pt"
        )
        return out["pixel_values_videos"][0]

    def pack(self, streams: list[Stream], rng: np.random.Generator | None, frames: np.ndarray | None = None) -> Batch:
        """The batch of `streams`, their questions' wording varied by `rng` (as written without one);
        `frames` (all streams' frames in order) when already decoded or rendered."""
        if frames is None:
            frames = like_h264(np.concatenate([s.clip.render_steps() for s in streams]))
        rows, video_rows, targets, answers, answer_targets = [], [], [], [], []
        sequences: list[tuple[Question, list[int]]] = []
        frame0 = 0
        for b, stream in enumerate(streams):
            row = self._layout(stream, frame0, rng)
            video_rows += row["video_rows"]
            for pos, target, question, many in row["targets"]:
                if many and question is not None:
                    sequences.append((question, []))
                if many:
                    sequences[-1][1].append(len(targets))
                elif question is not None:
                    answer_targets.append(len(targets))
                    answers.append(question)
                targets.append((b, pos, target))
            rows.append(row)
            frame0 += stream.clip.frames
        length = max(len(r["ids"]) for r in rows)
        ids = torch.full((len(rows), length), self.pad, dtype=torch.long)
        positions = torch.zeros((len(rows), length), dtype=torch.long)
        group = torch.empty((len(rows), length), dtype=torch.long)
        limit = torch.zeros((len(rows), length), dtype=torch.long)
        for b, r in enumerate(rows):
            n = len(r["ids"])
            ids[b, :n] = torch.tensor(r["ids"])
            positions[b, :n] = torch.tensor(r["positions"])
            group[b, :n] = torch.tensor(r["group"])
            limit[b, :n] = torch.tensor(r["limit"])
            group[b, n:] = -2 - torch.arange(length - n)  # padding sees itself only
        return Batch(
            ids=ids,
            positions=positions,
            mask=block_mask(group, limit),
            pixels=self.pixels(frames),
            video_rows=torch.tensor(video_rows, dtype=torch.long),
            targets=torch.tensor(targets, dtype=torch.long).reshape(-1, 3),
            answers=answers,
            answer_targets=torch.tensor(answer_targets, dtype=torch.long),
            frame_labels=torch.tensor([self.labels(s.clip, t) for s in streams for t in range(s.clip.frames)]),
            sequences=sequences,
        )

    def _layout(self, stream: Stream, frame0: int, rng: np.random.Generator | None) -> dict:
        """One stream's tokens: prefix and chunks (context, group -1), then each question."""
        ids, group, limit = list(self.prefix), [-1] * len(self.prefix), list(range(1, len(self.prefix) + 1))
        video_rows: list[int] = []
        context_at: dict[int, int] = {}  # steps seen -> context tokens then
        frames = stream.clip.frames
        newline = -1  # the last feature row of the batch: the model's image_newline
        for end in cuts(frames, stream.chunk):
            start = end - (stream.chunk if end % stream.chunk == 0 else end % stream.chunk)
            for f in range(start, end):
                video_rows += [(frame0 + f) * self.per_frame + j for j in range(self.per_frame)]
            video_rows.append(newline)
            n = (end - start) * self.per_frame + 1
            ids += [self.video_id] * n
            group += [-1] * n
            limit += list(range(len(limit) + 1, len(limit) + n + 1))
            context_at[end] = len(ids)
        positions = list(range(len(ids)))
        # (position, target id, its question at an answer's first word, part of a many-word answer)
        targets: list[tuple[int, int, Question | None, bool]] = []
        for j, q in enumerate(stream.questions):
            q_ids = self.question_ids(surface(q.text, rng))
            answer = self.answer_ids(q.answer)
            tokens = [*q_ids, *answer]
            start_pos, start = context_at[q.at], len(ids)
            ids += tokens
            positions += list(range(start_pos, start_pos + len(tokens)))
            group += [j] * len(tokens)
            limit += [start_pos] * len(tokens)
            many = len(answer) > 1 or q.kind == RECALL  # a description is scored word by word, even one word long
            for k, target in enumerate([*answer, self.eos]):
                targets.append((start + len(q_ids) - 1 + k, target, q if k == 0 else None, many))
        return {
            "ids": ids,
            "positions": positions,
            "group": group,
            "limit": limit,
            "video_rows": video_rows,
            "targets": targets,
        }


NO_SIDE = -100  # cross_entropy's ignore index: a frame with nothing, or with its object in the middle


def frame_label(clip: Clip, t: int) -> tuple[int, int, int]:
    """What step t shows, as class indices: shape and colour (0 where there is nothing), and side
    (NO_SIDE where there is none)."""
    v = clip.visible(t)
    if v is None:
        return (0, 0, NO_SIDE)
    side = v.side_at(t)
    return (
        1 + SHAPES.index(v.shape),
        1 + list(COLOURS).index(v.colour_at(t)),
        NO_SIDE if side is None else SIDES.index(side),
    )


def like_h264(frames: np.ndarray) -> np.ndarray:
    """Frames (N, H, W, 3) uint8 as an H.264 file in yuv420p gives them back, to a close
    approximation: colour kept at half resolution (2 x 2 blocks averaged in BT.601 YUV). Training
    on these keeps the model from meeting the files' softened colour edges for the first time at
    test (docs/toyworld.md has the measured differences)."""
    f = frames.astype(np.float32)
    y = f @ np.asarray([0.299, 0.587, 0.114], np.float32)
    u, v = (f[..., 2] - y) * 0.564, (f[..., 0] - y) * 0.713
    n, h, w = y.shape

    def half(c: np.ndarray) -> np.ndarray:
        c = c.reshape(n, h // 2, 2, w // 2, 2).mean((2, 4))
        return np.repeat(np.repeat(c, 2, 1), 2, 2)

    u, v = half(u), half(v)
    r, b = y + 1.403 * v, y + 1.773 * u
    g = (y - 0.299 * r - 0.114 * b) / 0.587
    return np.clip(np.rint(np.stack([r, g, b], -1)), 0, 255).astype(np.uint8)


def block_mask(group: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L) bool: token i sees token k <= i when k is context (group -1) among the first
    limit[i] tokens, or when both belong to the same question (or are the same padding token)."""
    L = group.shape[1]
    k = torch.arange(L)
    causal = k[None, :] <= k[:, None]
    context = (group[:, None, :] == -1) & (k[None, None, :] < limit[:, :, None])
    same = group[:, None, :] == group[:, :, None]
    return (causal[None] & (context | same))[:, None]
