"""Train the toy model on the toy world: seeded, deterministic on a CPU, with a curriculum.

The recipe (docs/toyworld.md has the numbers it reached): streams start a few steps long, so the
vision tower first learns what is on screen, and grow to the held-out clips' length, so that the
positions seen at test time are ones trained on (full attention over the whole stream); AdamW with
a warm-up and a cosine decay, gradients clipped. Every `eval_every` steps the accuracy on a
validation set (its own seeds, neither trained on nor held out) is logged per question type.

A run is named by its settings hash: the hash of every setting and every seed that decides the
data, not of the weights (bit-exact weights across machines are not promised), so a committed
checkpoint can be checked to be what the script's settings make.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hermes.models.loading import wrap
from hermes.toyworld.data import TASK_WEIGHTS, Batch, Packer, Stream, frame_label, like_h264, sample_stream
from hermes.toyworld.model import TOKENS_PER_FRAME, ModelSpec, build_model, frame_tokens, save
from hermes.toyworld.questions import SIDES, TEMPLATES
from hermes.toyworld.world import COLOURS, SHAPES, WorldSpec

# The first stage asks only about the newest frame: what the vision tower has just learnt to see.
REAL_TIME_ONLY = (("OJR", 1.0), ("ATR", 1.0), ("STU", 1.0), ("SSR", 1.0))
# The last stage leans on the past: the real-time answers are right by then on the validation set,
# "did you see" (HLD) is the slowest to learn.
BACKWARD_HEAVY = (
    ("OJR", 0.5),
    ("ATR", 1.0),
    ("STU", 0.5),
    ("SSR", 1.0),
    ("EPM", 2.5),
    ("HLD", 3.0),
    ("HLD-never", 0.5),
)
# Bump when the data or the recipe changes in a way the settings do not show.
RECIPE_VERSION = 1
RECORD = "training.json"  # a trained checkpoint's record of how it was made (`hermes.toyworld.recipe`)


@dataclass(frozen=True)
class Stage:
    """A stretch of training on clips of `frames` steps (a range, inclusive) with `questions` each,
    drawn with `weights` (task: weight; the spec's own when empty)."""

    steps: int
    frames: tuple[int, int]
    questions: int
    weights: tuple[tuple[str, float], ...] = ()
    frame_loss: float = 0.2  # weight of the frame probe's loss (see `FrameProbe`), kept on to hold the vision steady


@dataclass(frozen=True)
class TrainSpec:
    """Everything that decides a training run."""

    seed: int = 0
    model: ModelSpec = field(default_factory=ModelSpec)
    # First the vision tower alone, through the frame probe: `pretrain_steps` steps of `pretrain_frames`
    # frames, the learning rate falling from `pretrain_lr` to a tenth of it.
    pretrain_steps: int = 600
    pretrain_frames: int = 64
    pretrain_lr: float = 2e-3
    stages: tuple[Stage, ...] = (
        Stage(300, (1, 4), 6, REAL_TIME_ONLY),
        Stage(500, (4, 12), 10),
        Stage(800, (12, 24), 12),
        Stage(1000, (24, 32), 14, BACKWARD_HEAVY),
    )
    batch: int = 16
    lr: float = 1e-3
    warmup: int = 200
    min_lr: float = 5e-5
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    train_seed0: int = 10_000_000  # stream i of step s: seed train_seed0 + s * (largest batch) + i
    val_seed0: int = 20_000_000
    val_streams: int = 64
    val_frames: int = 32
    eval_every: int = 250
    task_weights: tuple[tuple[str, float], ...] = tuple(TASK_WEIGHTS.items())

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    def stage_at(self, step: int) -> Stage:
        for stage in self.stages:
            if step < stage.steps:
                return stage
            step -= stage.steps
        return self.stages[-1]

    def to_dict(self) -> dict:
        return asdict(self)

    def settings_hash(self) -> str:
        """The hash of every setting and seed of the run, the world, the templates and the recipe."""
        facts = {
            "train": self.to_dict(),
            "world": asdict(WorldSpec()),
            "templates": TEMPLATES,
            "tokens_per_frame": TOKENS_PER_FRAME,
            "recipe": RECIPE_VERSION,
        }
        return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def warm_cosine(step: int, lr: float, warmup: int, steps: int, floor: float = 0.0) -> float:
    """Linear warm-up to `lr` over `warmup` steps, then a cosine down to `floor` at step `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    done = (step - warmup) / max(1, steps - warmup)
    return floor + 0.5 * (lr - floor) * (1 + math.cos(math.pi * min(1.0, done)))


def learning_rate(spec: TrainSpec, step: int) -> float:
    """The stages' rate: a warm-up to `lr`, then a cosine down to `min_lr` at the last step."""
    return warm_cosine(step, spec.lr, spec.warmup, spec.total_steps, spec.min_lr)


def adamw(named: list[tuple[str, torch.nn.Parameter]], spec: TrainSpec, lr: float | None = None) -> torch.optim.AdamW:
    """The recipe's optimiser over `named` parameters: weight decay on matrices but not embeddings."""
    decay = [p for n, p in named if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in named if not (p.ndim >= 2 and "embed" not in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=spec.lr if lr is None else lr,
        betas=(0.9, 0.98),
    )


class FrameProbe(torch.nn.Module):
    """A training aid, not part of the checkpoint: linear read-outs of what a frame shows (shape,
    colour, side) from the mean of the frame's tokens. Early in the
    curriculum its loss teaches the vision tower directly, which the answers alone do slowly."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        sizes = (len(SHAPES) + 1, len(COLOURS) + 1, len(SIDES))  # shape and colour have a "nothing" class
        self.heads = torch.nn.ModuleList(torch.nn.Linear(hidden, n) for n in sizes)

    def loss(self, frame_features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pooled = frame_features.mean(1)
        return sum(torch.nn.functional.cross_entropy(h(pooled), labels[:, i]) for i, h in enumerate(self.heads))


def target_logits(model: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits (n_targets, vocab) at the batch's scored tokens, from one pass over every stream:
    the vision tower on every frame, its features in the video slots (the chunk's newline token after
    each chunk), the language model under the block mask; and each frame's tokens (frames, 4, hidden)."""
    inner = model.model
    feats = inner.get_video_features(
        batch.pixels[:, None], vision_feature_layer=-1, vision_feature_select_strategy="full"
    ).pooler_output
    frames = feats[:, : frame_tokens(model.config)]  # each frame alone: drop its newline
    rows = torch.cat([frames.reshape(-1, feats.shape[-1]), inner.image_newline[None].to(feats.dtype)])
    embeds = inner.get_input_embeddings()(batch.ids)
    video = (batch.ids == model.config.video_token_id)[..., None]
    embeds = embeds.masked_scatter(video, rows[batch.video_rows].to(embeds.dtype))
    hidden = inner.language_model(
        inputs_embeds=embeds, attention_mask=batch.mask, position_ids=batch.positions
    ).last_hidden_state
    return model.lm_head(hidden[batch.targets[:, 0], batch.targets[:, 1]]), frames


def option_accuracy(logits: torch.Tensor, batch: Batch, packer: Packer) -> dict[str, list[bool]]:
    """For each answer, whether its word has the highest logit among its question's options; by task."""
    out: dict[str, list[bool]] = defaultdict(list)
    answer_logits = logits[batch.answer_targets]
    for row, q in zip(answer_logits, batch.answers, strict=True):
        ids = [packer.answer_id(w) for w in (*q.options, *(("nothing",) if q.task == "OJR" else ()))]
        out[q.task].append(ids[int(row[ids].argmax())] == packer.answer_id(q.answer))
    return out


VAL_QUESTIONS = 16  # questions asked of each validation stream


def draw_streams(
    sample: Callable[[int, int, int, dict[str, float]], Stream],
    first: int,
    n: int,
    frames: tuple[int, int],
    questions: int,
    weights: dict[str, float],
) -> list[Stream]:
    """`n` streams made by `sample` from seeds `first` on, each of a length in `frames` (inclusive)
    drawn from its own seed, with `questions` each."""
    out = []
    for seed in range(first, first + n):
        length = int(np.random.default_rng(seed).integers(frames[0], frames[1] + 1))
        out.append(sample(seed, length, questions, weights))
    return out


class Trainer:
    """One training run of `spec`; `run` trains, logging to `log` and checkpointing to `out`. The
    world's parts (its words, streams, probe and card) are the methods a second world overrides."""

    def __init__(self, spec: TrainSpec, log: Callable[[str], None] = print) -> None:
        self.spec = spec
        self.log = log
        model, processor = build_model(spec.model, spec.seed, self.words())
        self.lm = wrap(model, processor, source="toy (training)")
        self.model = model
        self.packer = Packer(self.lm, self.frame_label)
        self.probe = self.make_probe()
        self.opt = adamw([*model.named_parameters(), *self.probe.named_parameters(prefix="probe")], spec)
        vision = [*model.model.vision_tower.parameters(), *model.model.multi_modal_projector.parameters()]
        self.pre_opt = torch.optim.AdamW([*vision, *self.probe.parameters()], lr=spec.pretrain_lr, weight_decay=0.0)
        weights = dict(spec.task_weights)
        self.val = [
            self.sample(spec.val_seed0 + i, spec.val_frames, VAL_QUESTIONS, weights) for i in range(spec.val_streams)
        ]
        self.curve: list[dict] = []
        # Streams of step s take the seeds from train_seed0 + s * stride on, so no two steps share one.
        self.stride = max(self.batch_size(step) for step in range(spec.total_steps))

    # -- the world's parts ------------------------------------------------------------------------

    def words(self) -> list[str] | None:
        """The world's words for the tokenizer (None: the first world's)."""
        return None

    def sample(self, seed: int, frames: int, questions: int, weights: dict[str, float]) -> Stream:
        return sample_stream(seed, frames, questions, weights)

    def frame_label(self, clip: Any, t: int) -> tuple[int, ...]:
        return frame_label(clip, t)

    def make_probe(self) -> torch.nn.Module:
        return FrameProbe(self.spec.model.hidden)

    def batch_size(self, step: int) -> int:
        return self.spec.batch

    def save(self, out: str | Path) -> None:
        save(self.model.eval(), self.lm.processor, out)

    def loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The answers' loss: every scored token alike."""
        return torch.nn.functional.cross_entropy(logits.float(), batch.targets[:, 2])

    # -- training ---------------------------------------------------------------------------------

    def streams(self, step: int) -> list[Stream]:
        stage = self.spec.stage_at(step)
        weights = dict(stage.weights or self.spec.task_weights)
        first = self.spec.train_seed0 + step * self.stride
        return draw_streams(self.sample, first, self.batch_size(step), stage.frames, stage.questions, weights)

    def pretrain_step(self, step: int) -> float:
        """One step of the vision tower and the frame probe alone, on frames of short clips."""
        spec = self.spec
        seeds = range(
            spec.train_seed0 - (step + 1) * spec.pretrain_frames, spec.train_seed0 - step * spec.pretrain_frames
        )
        clips = [self.sample(seed, 8, 0, {}).clip for seed in seeds]
        rng = np.random.default_rng(spec.train_seed0 - step - 1)
        times = [int(rng.integers(c.frames)) for c in clips]
        frames = np.stack([c.render(t) for c, t in zip(clips, times, strict=True)])
        labels = torch.tensor([self.frame_label(c, t) for c, t in zip(clips, times, strict=True)])
        pixels = self.packer.pixels(like_h264(frames))
        feats = self.model.model.get_video_features(
            pixels[:, None], vision_feature_layer=-1, vision_feature_select_strategy="full"
        ).pooler_output[:, : self.packer.per_frame]
        loss = self.probe.loss(feats, labels)
        for group in self.pre_opt.param_groups:  # a cosine from pretrain_lr down to a tenth of it
            group["lr"] = spec.pretrain_lr * (0.55 + 0.45 * math.cos(math.pi * step / spec.pretrain_steps))
        self.pre_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.pre_opt.step()
        return float(loss.detach())

    def step(self, step: int) -> float:
        """One optimiser step of the stages; the batch's mean loss."""
        spec = self.spec
        batch = self.packer.pack(self.streams(step), np.random.default_rng(spec.train_seed0 + step))
        return self.update(self.opt, batch, learning_rate(spec, step), spec.stage_at(step).frame_loss)

    def update(self, opt: torch.optim.Optimizer, batch: Batch, lr: float, frame_loss: float = 0.0) -> float:
        """One step of `opt` at `lr` on `batch` (with the frame probe's loss at `frame_loss`); its mean loss."""
        self.model.train()
        logits, frames = target_logits(self.model, batch)
        loss = self.loss(logits, batch)
        if frame_loss > 0:
            loss = loss + frame_loss * self.probe.loss(frames, batch.frame_labels)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.clip_norm)
        opt.step()
        return float(loss.detach())

    def validate(self) -> dict[str, float]:
        """Accuracy per task on the validation streams (full attention, as the full cache sees them)."""
        return self.accuracy(self.val)

    @torch.no_grad()
    def accuracy(self, streams: list[Stream]) -> dict[str, float]:
        """Accuracy per task on `streams`, packed `spec.batch` at a time."""
        self.model.eval()
        hits: dict[str, list[bool]] = defaultdict(list)
        for i in range(0, len(streams), self.spec.batch):
            batch = self.packer.pack(streams[i : i + self.spec.batch], None)
            logits = target_logits(self.model, batch)[0]
            for task, ok in option_accuracy(logits, batch, self.packer).items():
                hits[task] += ok
            for q, rows in batch.sequences:  # a many-word answer is right when all its words are
                hits[q.task].append(bool((logits[rows].argmax(-1) == batch.targets[rows, 2]).all()))
        return {task: float(np.mean(ok)) for task, ok in sorted(hits.items())}

    def record(self, point: dict[str, Any], validate: bool = False) -> None:
        """Add `point` to the curve (with the validation's scores if `validate`) and log it."""
        if validate:
            point["val"] = self.validate()
        self.curve.append(point)
        self.log(json.dumps(point))

    def run(self, out: str | Path | None = None) -> list[dict]:
        """Train every stage; the curve (loss every 25 steps, validation every `eval_every`)."""
        spec = self.spec
        started = time.monotonic()
        losses: list[float] = []
        for step in range(spec.pretrain_steps):
            losses.append(self.pretrain_step(step))
            if (step + 1) % 50 == 0:
                point = {
                    "pretrain_step": step + 1,
                    "frame_loss": float(np.mean(losses)),
                    "elapsed_s": round(time.monotonic() - started, 1),
                }
                losses = []
                self.record(point)
        for step in range(spec.total_steps):
            losses.append(self.step(step))
            last = step + 1 == spec.total_steps
            if (step + 1) % 25 == 0 or last:
                point: dict[str, Any] = {
                    "step": step + 1,
                    "loss": float(np.mean(losses)),
                    "lr": learning_rate(spec, step),
                    "frames": list(spec.stage_at(step).frames),
                    "elapsed_s": round(time.monotonic() - started, 1),
                }
                losses = []
                self.record(point, validate=(step + 1) % spec.eval_every == 0 or last)
        if out is not None:
            self.save(out)
        return self.curve
