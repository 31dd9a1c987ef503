"""Train the second world's model: the first world's recipe (`hermes.toyworld.train`) at its size.

What differs: a deeper language model (8 layers, so the paper's 10/60/30 split gives the tiers
1 / 5 / 2 layers), 112 px frames of 16 tokens, the frame probe reading each lane from all of a
frame's tokens (a frame's mean holds no one object), a curriculum that ends on the held-out
length of 64 steps with fewer streams a step (a step's cost grows with the square of a stream's
tokens), the loss of a many-word answer (recall, scene) spread over its words so that one such
answer weighs as much as two one-word ones, and a last stage for the words (`Polish`): the language
model alone on questions in more wordings, which a checkpoint of the stages can be given on its own.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hermes.models.card import ModelCard
from hermes.models.loading import load_video_lm
from hermes.toyworld.data import NO_SIDE, Batch, Stream
from hermes.toyworld.data2 import TASK_WEIGHTS2, frame_label2, sample_stream2
from hermes.toyworld.model import ModelSpec, save, tokens_per_frame
from hermes.toyworld.questions import SIDES
from hermes.toyworld.questions2 import (
    EXTRA_WORDINGS,
    HELDOUT,
    HELDOUT_WORDINGS,
    TRAIN_WORDINGS,
    WHERE,
    WIDE,
    vocabulary2,
)
from hermes.toyworld.train import (
    RECORD,
    VAL_QUESTIONS,
    Stage,
    Trainer,
    TrainSpec,
    adamw,
    draw_streams,
    warm_cosine,
)
from hermes.toyworld.world import COLOURS, WORLD_FPS
from hermes.toyworld.world2 import GRID, LANES, SHAPES2, spec_facts

RECIPE_VERSION2 = 2  # 2: a one-word description ("nothing") is scored as a description
REAL_TIME_ONLY2 = (("OJR", 1.0), ("ATR", 1.0), ("STU", 1.0), ("SSR", 1.0), ("NOW", 0.5))
BACKWARD_HEAVY2 = (
    ("OJR", 0.7),
    ("ATR", 1.0),
    ("STU", 0.5),
    ("SSR", 1.0),
    ("EPM", 2.5),
    ("HLD", 3.0),
    ("HLD-never", 0.5),
    ("REC", 0.7),
    ("NOW", 0.3),
)


@dataclass(frozen=True)
class ModelSpec2(ModelSpec):
    """The second world's model: 8 language layers, 112 px frames in 14 px patches (16 tokens)."""

    layers: int = 8
    hidden: int = 64
    intermediate: int = 192
    image_side: int = 112
    patch: int = 14


@dataclass(frozen=True)
class Stage2(Stage):
    """A stage with its own number of streams a step."""

    batch: int = 8


@dataclass(frozen=True)
class Polish:
    """The recipe's last stage, for the words: the language model alone (the vision tower and its
    projector frozen, so what a frame's tokens say stays what the stages taught), with its own AdamW
    warming up to `lr` and falling along a cosine to nothing, on held-out-length streams whose
    questions are drawn from the training and the extra wordings together (`questions2.WIDE`), with
    the last stage's mix of tasks."""

    steps: int = 600
    frames: tuple[int, int] = (40, 64)
    questions: int = 14
    batch: int = 4
    lr: float = 2e-4
    warmup: int = 50
    weights: tuple[tuple[str, float], ...] = BACKWARD_HEAVY2
    seed0: int = 70_000_000  # stream i of polish step s: seed seed0 + s * batch + i


@dataclass(frozen=True)
class TrainSpec2(TrainSpec):
    """Everything that decides a training run of the second world's model."""

    model: ModelSpec = field(default_factory=ModelSpec2)
    pretrain_steps: int = 2000
    stages: tuple[Stage, ...] = (
        Stage2(1000, (1, 4), 6, REAL_TIME_ONLY2, batch=16),
        Stage2(1500, (4, 16), 10, batch=8),
        Stage2(1200, (16, 32), 12, batch=8),
        Stage2(1800, (40, 64), 14, BACKWARD_HEAVY2, batch=4),
    )
    batch: int = 8  # the validation's streams a pass
    warmup: int = 150
    train_seed0: int = 50_000_000
    val_seed0: int = 60_000_000
    val_streams: int = 16
    val_frames: int = 64
    eval_every: int = 300
    task_weights: tuple[tuple[str, float], ...] = tuple(TASK_WEIGHTS2.items())
    locate: bool = True  # the frame probe also asks each token where in the frame it is (`FrameProbe2`)
    identify: bool = True  # ... and what each lane shows in it, if anything (`FrameProbe2`)
    identify_side: bool = True  # ... and the side of the object it shows, if any (`FrameProbe2`)
    polish: Polish | None = field(default_factory=Polish)  # the last stage, for the words (None: none)

    def settings_hash(self) -> str:
        """The hash of every setting and seed of the run, the world, the wordings and the recipe. A run
        without the polish hashes as it did before the polish existed, so a checkpoint of the stages
        alone keeps its name (and can start a polish, `Trainer2.run`)."""
        train, wordings = self.to_dict(), [TRAIN_WORDINGS, HELDOUT_WORDINGS]
        if self.polish is None:
            del train["polish"]
        else:
            wordings.append(EXTRA_WORDINGS)
        facts = {"train": train, "world": spec_facts(), "wordings": wordings, "recipe": RECIPE_VERSION2}
        return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


class FrameProbe2(torch.nn.Module):
    """A training aid, not saved: linear read-outs of each lane's shape, colour and side from all of
    a frame's tokens (flattened), since a frame's mean mixes its objects. With `locate`, each token
    also reads out its own row and column in the frame's grid: the flattened read-out knows a token
    by its slot, so nothing else asks a token's features to say where it is, and the language model
    must then tell "at the top" or "on the left" from positions alone. With `identify`, each token
    reads out, per lane, the shape and colour of the lane's object where it covers the token's cell
    (none elsewhere): the flattened read-out lets a shape be spread over a frame's tokens, and then
    no single key says "ring" for a question about the ring to find in the past. With `side` too, each
    token reads out per lane the side of the object it shows (none where it shows none): on the grid
    an object looks the same in every cell, so its side is otherwise only in which slot shows it, a
    feature every token has whatever it shows, and a model that finds the object does not learn to
    read its side from it (docs/toyworld.md)."""

    def __init__(
        self, hidden: int, per_frame: int, locate: bool = False, identify: bool = False, side: bool = False
    ) -> None:
        super().__init__()
        sizes = (len(SHAPES2) + 1, len(COLOURS) + 1, len(SIDES)) * len(LANES)
        self.heads = torch.nn.ModuleList(torch.nn.Linear(hidden * per_frame, n) for n in sizes)
        self.side = math.isqrt(per_frame)
        self.where = torch.nn.Linear(hidden, 2 * self.side) if locate else None
        self.what = torch.nn.Linear(hidden, len(LANES) * (len(SHAPES2) + len(COLOURS) + 2)) if identify else None
        self.which_side = torch.nn.Linear(hidden, len(LANES) * 3) if identify and side else None

    def loss(self, frame_features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat = frame_features.reshape(frame_features.shape[0], -1)
        # A column with no label to read (a lane whose objects never leave the middle) adds nothing:
        # cross-entropy over no rows is not a number.
        loss = sum(
            torch.nn.functional.cross_entropy(h(flat), labels[:, i])
            for i, h in enumerate(self.heads)
            if bool((labels[:, i] != NO_SIDE).any())
        )
        f = torch.nn.functional.cross_entropy
        tokens = frame_features.reshape(-1, frame_features.shape[-1])
        if self.where is not None:
            slot = torch.arange(frame_features.shape[1]).repeat(frame_features.shape[0])
            row, col = self.where(tokens).split(self.side, dim=-1)
            loss = loss + f(row, slot // self.side) + f(col, slot % self.side)
        if self.what is not None:
            loss = loss + self.identify_loss(tokens, labels, frame_features.shape[1])
        return loss

    def identify_loss(self, tokens: torch.Tensor, labels: torch.Tensor, per_frame: int) -> torch.Tensor:
        """Each token's shape and colour per lane (and side, with `side`): the lane's where its
        object covers the token's cell (the labels' bit masks after the 9 lane columns), none elsewhere."""
        lanes, shapes, colours = len(LANES), len(SHAPES2) + 1, len(COLOURS) + 1
        covers = (labels[:, 3 * lanes :, None] >> torch.arange(per_frame)) & 1  # (frame, lane, token)

        def per_token(column: int) -> torch.Tensor:  # (frame * token * lane,), in the order of `out`
            return (labels[:, column : 3 * lanes : 3, None] * covers).transpose(1, 2).reshape(-1)

        out = self.what(tokens).reshape(-1, lanes, shapes + colours)
        f = torch.nn.functional.cross_entropy
        loss = f(out[..., :shapes].reshape(-1, shapes), per_token(0)) + f(
            out[..., shapes:].reshape(-1, colours), per_token(1)
        )
        if self.which_side is not None:
            sides = labels[:, 2 : 3 * lanes : 3]
            sides = torch.where(sides == NO_SIDE, 0, sides + 1)[:, :, None] * covers
            loss = loss + f(self.which_side(tokens).reshape(-1, 3), sides.transpose(1, 2).reshape(-1))
        return loss


class Trainer2(Trainer):
    """A training run of `TrainSpec2` on the second world."""

    def words(self) -> list[str]:
        return vocabulary2()

    def sample(self, seed: int, frames: int, questions: int, weights: dict[str, float]) -> Stream:
        return sample_stream2(seed, frames, questions, weights or TASK_WEIGHTS2)

    def frame_label(self, clip: Any, t: int) -> tuple[int, ...]:
        return frame_label2(clip, t)

    @cached_property
    def val_new_words(self) -> list[Stream]:
        """The validation streams' clips, with questions drawn in the held-out wordings."""
        spec, weights = self.spec, dict(self.spec.task_weights)
        return [
            sample_stream2(spec.val_seed0 + i, spec.val_frames, VAL_QUESTIONS, weights, HELDOUT)
            for i in range(spec.val_streams)
        ]

    def validate(self) -> dict[str, float]:
        """Per task on the validation streams, then on their clips asked in the held-out wordings (keys
        "<task> new words"): the gap to words never trained shows while training, not only on the
        held-out clips after it. Nothing in the recipe is chosen by it."""
        new = {f"{task} new words": v for task, v in self.accuracy(self.val_new_words).items()}
        return super().validate() | new

    def make_probe(self) -> torch.nn.Module:
        spec = self.spec.model
        per_frame = tokens_per_frame(spec.image_side, spec.patch)
        own = (
            self.spec
            if isinstance(self.spec, TrainSpec2)
            else TrainSpec2(locate=False, identify=False, identify_side=False)
        )
        if own.identify and math.isqrt(per_frame) != GRID:
            raise ValueError(f"the probe's cell labels are for a {GRID} x {GRID} grid of tokens")
        return FrameProbe2(spec.hidden, per_frame, locate=own.locate, identify=own.identify, side=own.identify_side)

    def batch_size(self, step: int) -> int:
        stage = self.spec.stage_at(step)
        return stage.batch if isinstance(stage, Stage2) else self.spec.batch

    def run(self, out: str | Path | None = None, start: str | Path | None = None) -> list[dict]:
        """Train every stage, then the polish (if the spec has one). With `start`, a checkpoint of
        these same stages (its record's settings hash says so), only the polish, from its weights and
        curve: a run's first hour and a half need not be trained again to polish it."""
        if start is None:
            super().run()
        else:
            self.resume(start)
        if self.spec.polish is not None:
            self.polish(self.spec.polish)
        if out is not None:
            self.save(out)
        return self.curve

    def resume(self, start: str | Path) -> None:
        """Take the weights and the curve of `start`, trained by this spec's stages without the polish."""
        want = replace(self.spec, polish=None).settings_hash()
        if not Path(start, RECORD).is_file():
            raise ValueError(f"{start} holds no {RECORD}: not a checkpoint this recipe trained")
        record = json.loads(Path(start, RECORD).read_text())
        if record.get("settings_hash") != want:
            raise ValueError(
                f"{start} was trained with settings {record.get('settings_hash')}, not this recipe's stages ({want})"
            )
        weights = load_video_lm(str(start), dtype="fp32").model.state_dict()
        self.model.load_state_dict(weights)
        self.curve = list(record["curve"])

    def polish(self, polish: Polish) -> None:
        """The last stage (`Polish`): the language model alone, on questions in the wide wordings."""
        inner = self.model.model
        frozen = [*inner.vision_tower.parameters(), *inner.multi_modal_projector.parameters()]
        for p in frozen:
            p.requires_grad_(False)
        opt = adamw([(n, p) for n, p in self.model.named_parameters() if p.requires_grad], self.spec, polish.lr)
        weights, started, losses = dict(polish.weights), time.monotonic(), []
        wide = partial(sample_stream2, wording=WIDE)
        for step in range(polish.steps):
            first = polish.seed0 + step * polish.batch
            streams = draw_streams(wide, first, polish.batch, polish.frames, polish.questions, weights)
            batch = self.packer.pack(streams, np.random.default_rng(polish.seed0 - step - 1))
            lr = warm_cosine(step, polish.lr, polish.warmup, polish.steps)
            losses.append(self.update(opt, batch, lr))
            last = step + 1 == polish.steps
            if (step + 1) % 25 == 0 or last:
                point = {
                    "polish_step": step + 1,
                    "loss": float(np.mean(losses)),
                    "lr": lr,
                    "elapsed_s": round(time.monotonic() - started, 1),
                }
                losses = []
                self.record(point, validate=(step + 1) % self.spec.eval_every == 0 or last)
        for p in frozen:
            p.requires_grad_(True)

    def save(self, out: str | Path) -> None:
        save(self.model.eval(), self.lm.processor, out, card2())

    def loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Cross-entropy per scored token, a many-word answer's words sharing the weight of two."""
        weights = torch.ones(len(batch.targets))
        for _, rows in batch.sequences:
            weights[rows] = 2.0 / len(rows)
        losses = torch.nn.functional.cross_entropy(logits.float(), batch.targets[:, 2], reduction="none")
        return (losses * weights).sum() / weights.sum()


ABOUT2 = (
    "trained here on synthetic clips with two or three shapes at once (docs/toyworld.md, world v2); with its whole "
    "stream in view it answers 97% of held-out questions about the present and 88% about the past (chance 37%)"
)


# The page's suggestions, in training wordings: the scene and the story (the guidance prompts' own
# tasks), where an object is, and the past in the task the model reads best ("did you see": 97% on
# held-out clips, where "what colour was it" is at 80%).
QUESTIONS2 = (
    TRAIN_WORDINGS["NOW"][1],
    TRAIN_WORDINGS["REC"][0],
    TRAIN_WORDINGS["OJR"][0].format(where=WHERE["top"]),
    TRAIN_WORDINGS["HLD"][0].format(colour="red", shape="ring"),
)


def card2(frames: int = 64, chunk_frames: int = 4) -> ModelCard:
    """The second toy model's card: one frame a step, 4-frame chunks, a budget of a quarter of a
    held-out stream, HERMES beside FIFO; its own sample clips (`toyworld samples --world v2`)."""
    per_frame = tokens_per_frame(ModelSpec2.image_side, ModelSpec2.patch)
    tokens = frames * per_frame + frames // chunk_frames
    stream = {
        "fps": WORLD_FPS,
        "chunk_frames": chunk_frames,
        "budget": tokens // 4,
        "compare_policies": ["hermes", "fifo"],
    }
    return ModelCard(about=ABOUT2, stream=stream, samples=True, questions=QUESTIONS2)
