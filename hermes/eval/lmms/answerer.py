"""Answering lmms-eval's requests from the HERMES memory, without lmms-eval itself.

lmms-eval hands a model a video (a file, or a folder of frames) and a prompt built by the task.
Here the video streams once, chunk by chunk, through a StreamingSession, exactly as `hermes eval`
streams an offline benchmark's video; every request about it is then answered from the memory as
it is after the last frame, so a task's answers equal `hermes eval`'s for the same questions.
"""

from __future__ import annotations

from pathlib import Path

from hermes.engine.methods import DEFAULT_POLICY
from hermes.engine.session import StreamingSession
from hermes.eval.formats import BENCHES
from hermes.eval.harness import EvalSettings
from hermes.memory.config import HermesConfig
from hermes.models.base import VideoLM
from hermes.runtime.driver import play
from hermes.video.frames_folder import iter_video

# lmms-eval task names -> the benchmark whose re-indexing default (the paper's) they get.
_TASK_BENCHES = {"ovo": "ovobench", "videomme": "videomme", "mvbench": "mvbench", "streamingbench": "streamingbench"}


def default_reindex(task: str) -> str:
    """The paper's re-indexing for an lmms-eval task: lazy for streaming benchmarks (OVO-Bench),
    eager for offline ones, and for tasks of other benchmarks, which hand over whole clips."""
    bench = next((b for prefix, b in _TASK_BENCHES.items() if task.startswith(prefix)), "videomme")
    return BENCHES[bench].reindex


def video_of(visuals: object) -> str:
    """The one video of a request: a file or a folder of frames, as lmms-eval's video tasks give it."""
    if isinstance(visuals, list | tuple) and len(visuals) == 1:
        visuals = visuals[0]
    if isinstance(visuals, str | Path):
        return str(visuals)
    raise ValueError(
        f"the hermes model streams one video per request (a file or a folder of frames), got {type(visuals).__name__}"
    )


class StreamAnswerer:
    """One session: stream a video once, then answer any number of prompts about it."""

    def __init__(
        self,
        lm: VideoLM,
        config: HermesConfig,
        policy: str = DEFAULT_POLICY,
        frames_fps: float | None = None,
        settings: EvalSettings | None = None,
    ) -> None:
        settings = settings or EvalSettings()
        self.session = StreamingSession(lm, config, policy=policy, max_question_chars=settings.max_question_chars)
        self.frames_fps = frames_fps
        self.video: str | None = None

    def watch(self, video: str) -> None:
        """Stream `video` from its start to its end into a fresh memory (not again if it is the last one)."""
        if video == self.video:
            return
        self.video = None
        session = self.session
        session.reset()
        frames = iter_video(video, session.config.fps, folder_fps=self.frames_fps)
        for _ in play(session, frames, [], lambda _: None):
            pass
        self.video = video

    def generate(self, video: str, prompt: str, max_new_tokens: int) -> str:
        """The greedy answer to `prompt` after the whole video."""
        self.watch(video)
        return self.session.ask(prompt, max_new_tokens).text

    def loglikelihood(self, video: str, context: str, continuation: str) -> tuple[float, bool]:
        """log p(continuation | the video, context) and whether greedy decoding would produce it."""
        self.watch(video)
        ids = self.session.lm.tokenizer.encode(continuation, add_special_tokens=False)
        logp, greedy = self.session.continuation_logprobs(context, ids)
        return float(logp.sum()), bool(greedy.all())
