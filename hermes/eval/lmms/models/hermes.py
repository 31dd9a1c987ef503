"""lmms-eval's `hermes` model: each request's video streams through the HERMES memory.

Found by lmms-eval through LMMS_EVAL_PLUGINS=hermes.eval.lmms (see `hermes.eval.lmms`); only
lmms-eval imports this module. It follows lmms-eval's model interface (`lmms_eval/api/model.py`):
`generate_until` requests are (context, generation kwargs, doc_to_visual, doc_id, task, split),
`loglikelihood` requests (context, continuation, doc_to_visual, doc_id, task, split), and
`generate_until_multi_round` requests (context, generation kwargs, doc_to_visual, doc_to_text,
doc_id, task, split), whose doc_to_text hands out each next round's video and prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmms_eval.api.instance import Instance
from lmms_eval.api.model import lmms

from hermes.engine.methods import DEFAULT_POLICY, parse_policies
from hermes.eval.harness import EvalSettings
from hermes.eval.lmms.answerer import StreamAnswerer, default_reindex, video_of
from hermes.memory.config import HermesConfig
from hermes.models.loading import DEFAULT_MODEL, load_video_lm, set_threads


class HermesLMM(lmms):
    """model_args: pretrained (a hub id, a local folder, or 'tiny', 'tiny-qwen', 'tiny-qwen3'),
    policy (any policy name: hermes, fifo, full, sink, infinipot-v, streammem, rekv, simplestream,
    each also with +dtd; rekv retrieves with the whole prompt, the only text lmms-eval hands over),
    budget, chunk_frames, fps (default: the model's), reindex (default: the paper's, lazy for
    OVO-Bench and eager for the offline benchmarks), dtype,
    frames_fps (the rate of tasks that give frame folders) and threads (torch's CPU threads, as
    `hermes eval --threads`). Decoding is greedy; one process."""

    def __init__(
        self,
        pretrained: str = DEFAULT_MODEL,
        policy: str = DEFAULT_POLICY,
        budget: int = HermesConfig.budget,
        chunk_frames: int = HermesConfig.chunk_frames,
        fps: float | None = None,
        reindex: str | None = None,
        dtype: str = "auto",
        frames_fps: float | None = None,
        threads: int | None = None,
        device: str | None = None,
        batch_size: int | str = 1,
        max_batch_size: int | None = None,
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            raise ValueError(
                f"unknown model_args for the hermes model: {', '.join(sorted(unknown))}; it takes pretrained, policy, "
                "budget, chunk_frames, fps, reindex, dtype, frames_fps and threads"
            )
        self.lm = load_video_lm(str(pretrained), device=device, dtype=dtype)
        set_threads(int(threads or 0))  # as `hermes eval`: torch's own count unless given
        fps = self.lm.default_fps if fps is None else float(fps)
        # Built now so that a bad option fails before any request; each task then gets its re-indexing.
        self.config = HermesConfig(
            budget=int(budget), chunk_frames=int(chunk_frames), fps=fps, reindex=reindex or "lazy"
        )
        self.policy = parse_policies([str(policy)], self.config)[0]  # a bad policy fails now, not at a request
        self.reindex = reindex
        self.frames_fps = None if frames_fps is None else float(frames_fps)
        self.settings = EvalSettings()
        self._answerers: dict[str, StreamAnswerer] = {}

    def _answerer(self, task: str) -> StreamAnswerer:
        mode = self.reindex or default_reindex(task)
        if mode not in self._answerers:
            config = self.config.with_(reindex=mode)
            self._answerers[mode] = StreamAnswerer(self.lm, config, self.policy, self.frames_fps, self.settings)
        return self._answerers[mode]

    def _video(self, doc_to_visual: Callable, doc_id: int, task: str, split: str) -> str:
        """The video of a request's document."""
        return video_of(doc_to_visual(self.task_dict[task][split][doc_id]))

    def _max_new_tokens(self, gen_kwargs: dict) -> int:
        """max_new_tokens of a request's generation kwargs. Their `until` is not applied, as
        lmms-eval's own model classes for these backbones apply none (`hermes.eval.prompts`)."""
        if gen_kwargs.get("do_sample"):
            raise ValueError("the hermes model decodes greedily; this task asks for sampling (do_sample=True)")
        return int(gen_kwargs.get("max_new_tokens", self.settings.max_new_tokens))

    def _by_video(self, requests: list[Instance], answer: Callable) -> list:
        """Answer requests grouped by (task, video), so that each video streams once; results in
        the order of the requests. Both request kinds hold doc_to_visual, doc_id, task, split at 2-5."""
        keys = [(r.args[4], self._video(*r.args[2:6])) for r in requests]
        first = {key: i for i, key in reversed(list(enumerate(keys)))}
        results: list = [None] * len(requests)
        for i in sorted(range(len(requests)), key=lambda i: first[keys[i]]):
            task, path = keys[i]
            results[i] = answer(self._answerer(task), path, requests[i].args)
        return results

    def generate_until(self, requests: list[Instance]) -> list[str]:
        """The greedy answer to each prompt after the whole video."""

        def answer(answerer: StreamAnswerer, video: str, args: tuple) -> str:
            return answerer.generate(video, args[0], self._max_new_tokens(args[1]))

        return self._by_video(requests, answer)

    def loglikelihood(self, requests: list[Instance]) -> list[tuple[float, bool]]:
        """(log-probability, is greedy) of each continuation after its context and whole video."""

        def answer(answerer: StreamAnswerer, video: str, args: tuple) -> tuple[float, bool]:
            return answerer.loglikelihood(video, args[0], args[1])

        return self._by_video(requests, answer)

    def generate_until_multi_round(self, requests: list[Instance]) -> list[list[str]]:
        """Each round's video and prompt from the task's doc_to_text, until it signals the end."""
        out = []
        for request in requests:
            context, gen_kwargs, doc_to_visual, doc_to_text, doc_id, task, split = request.args
            doc = self.task_dict[task][split][doc_id]
            tokens = self._max_new_tokens(gen_kwargs)
            answerer = self._answerer(task)
            visuals, replies, round_idx, info = doc_to_visual(doc), [], 0, None
            while True:
                if round_idx > 0:
                    visuals, context, last, _, info = doc_to_text(
                        doc, previous_output=replies, round_idx=round_idx, previous_round_info=info
                    )
                    if last:
                        break
                replies.append(answerer.generate(video_of(visuals), context, tokens))
                round_idx += 1
            out.append(replies)
        return out
