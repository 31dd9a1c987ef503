"""Stream benchmark videos through a session and score their questions.

One session per video: the video streams from its start, and each question is asked when the
stream reaches its time (streaming benchmarks) or after the whole clip (offline ones), from the
memory as it is then, with the benchmark's own prompt (`Item.prompt`). Each answer is scored two
ways, side by side: by log-probability (the option letter whose token has the highest first-token
log-probability: `pred`, `correct`) and by the benchmark's own rule on the generated text
(`text_pred`, `text_correct`, and `text_counted` where the rule leaves an answer out). Every question
appends one JSON line to the results file as soon as it is scored, so an interrupted run resumes
where it stopped. Several processes can share the videos (`hermes.eval.shard`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from hermes.engine.session import QuestionError, StreamBound, StreamingSession
from hermes.eval.finder import VideoFinder
from hermes.eval.formats import BenchSpec
from hermes.eval.forward import answer_forward
from hermes.eval.items import LETTERS, ForwardItem, Item, ProactiveItem, Problem
from hermes.eval.policies import PolicyGroup, policy_out
from hermes.eval.proactive import ProactiveWatch, poll_times
from hermes.eval.scorers import text_score
from hermes.eval.shard import Shard, merge_lock, merge_parts, part_path
from hermes.eval.summary import ANSWERED, SKIPPED, read_results, summarize
from hermes.models.base import VideoLM
from hermes.runtime.driver import play
from hermes.video.decoding import UntilDamage, VideoError
from hermes.video.frames_folder import iter_video


@dataclass
class EvalSettings:
    """What a run does besides the model and the files."""

    max_new_tokens: int = 16  # 0: score only, no generated text
    limit: int | None = None  # the first N questions of the file
    max_question_chars: int = 8000  # benchmark prompts carry every option, so they run longer than a chat question


def letter_token_ids(lm: VideoLM, n: int) -> list[list[int]]:
    """Token ids that spell option letter i on its own ("A" and " A" where each is one token)."""
    out = []
    for letter in LETTERS[:n]:
        ids = set()
        for variant in (letter, f" {letter}"):
            tokens = lm.tokenizer.encode(variant, add_special_tokens=False)
            if len(tokens) == 1:
                ids.add(tokens[0])
        if not ids:  # a tokenizer without a one-token letter: its first piece still carries the choice
            ids.add(lm.tokenizer.encode(letter, add_special_tokens=False)[0])
        out.append(sorted(ids))
    return out


def score_options(logprobs: torch.Tensor, letter_ids: Sequence[Sequence[int]]) -> dict[str, float]:
    """Each option letter's log-probability: the best among the tokens that spell it."""
    return {LETTERS[i]: float(logprobs[list(ids)].max()) for i, ids in enumerate(letter_ids)}


def _skip(item: Item | Problem, reason: str) -> dict:
    return {"qid": item.qid, "task": item.task, "status": SKIPPED, "reason": reason}


# -- asking ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Poll:
    """One poll of a proactive task, due at `at_s`."""

    at_s: float
    watch: ProactiveWatch
    last: bool


def _record(session: StreamingSession, item: Item, fields: dict) -> dict:
    return {
        "qid": item.qid,
        "task": item.task,
        "group": item.group,
        "status": ANSWERED,
        "video": item.video,
        "at_s": item.at_s,
        "stream_s": session.stream_time_s,
        "frames_seen": session.frames_seen,
        "answer": item.answer,
        **fields,
    }


def _ask(session: StreamingSession, item: Item, letter_ids: list[list[int]], settings: EvalSettings) -> dict:
    """Score one question from the memory as it is now; a record for the results file."""
    try:
        if isinstance(item, ForwardItem):  # OVO-Bench forward: yes/no or a count, scored as OVO-Bench does
            fields = answer_forward(session, item, settings.max_new_tokens)
        else:
            fields = _answer_choice(session, item, letter_ids, settings)
    except QuestionError as exc:
        return _skip(item, str(exc))
    return _record(session, item, fields)


def _poll(session: StreamingSession, poll: _Poll) -> dict | None:
    """One poll of a proactive task: its record once the task is decided, else None."""
    watch = poll.watch
    if watch.done:
        return None
    try:
        fields = watch.poll(session, poll.at_s, poll.last)
    except QuestionError as exc:
        watch.give_up()
        return _skip(watch.item, str(exc))
    return _record(session, watch.item, fields) if fields is not None else None


def _answer_choice(session: StreamingSession, item: Item, letter_ids: list[list[int]], settings: EvalSettings) -> dict:
    """A multiple-choice question's prediction fields: the letter with the highest first-token
    log-probability, and the generated text as the benchmark's rule reads it."""
    n = len(item.options)
    # A retrieval policy (rekv) retrieves with the question alone, not the prompt's instructions and options.
    scores = score_options(session.first_token_logprobs(item.prompt, query=item.question), letter_ids[:n])
    tokens = settings.max_new_tokens
    answer = session.ask(item.prompt, tokens, query=item.question) if tokens > 0 else None
    pred = max(scores, key=scores.__getitem__)
    text = answer.text if answer else ""
    read = text_score(item.rule, text, item.answer, n) if answer else None
    return {
        "pred": pred,
        "correct": pred == item.answer,
        "option_logprobs": scores,
        "text": text,
        "text_pred": read.pred if read else None,
        "text_correct": read.correct if read else None,
        "text_counted": bool(read and read.counted),
        "ttft_ms": answer.ttft_ms if answer else None,
    }


# -- streaming ------------------------------------------------------------------------------------


def _events(items: list[Item], settings: EvalSettings) -> list[Item | _Poll]:
    """What the stream stops for: each question, or each poll of a proactive task."""
    events: list[Item | _Poll] = []
    for item in items:
        if isinstance(item, ProactiveItem):
            watch, times = ProactiveWatch(item, settings.max_new_tokens), poll_times(item)
            events += [_Poll(t, watch, t == times[-1]) for t in times]
        else:
            events.append(item)
    return events


def _stream_video(
    session: StreamingSession,
    path: Path,
    items: list[Item],
    letter_ids: list[list[int]],
    settings: EvalSettings,
    whole: bool,
) -> Iterator[dict]:
    """Stream one video (from the items' start to their end, or all of it when the file is
    already the clip) and yield a record per question.

    Questions are asked in time order once the stream has passed their time; questions without a
    time, or past the end, after the last frame. In a file damaged part-way, the questions from the
    damage on (and those without a time) are skipped with the reason.
    """
    session.reset()
    config = session.config
    first = items[0]
    start, end = (0.0, None) if whole else (first.start_s, first.end_s)
    events = _events(items, settings)
    timed = [e.at_s for e in events if e.at_s is not None]
    if len(timed) == len(events):  # every question has a time: decode no further than the last one needs
        last = max(timed) + 1.0 / config.fps
        end = last if end is None else min(end, last)
    frames = UntilDamage(iter_video(path, config.fps, folder_fps=first.frames_fps, start=start, end=end))
    for event in play(session, frames, events, lambda e: e.at_s, stop_when_done=True):
        if not isinstance(event, Item | _Poll):  # a chunk's report
            continue
        damage = frames.damage
        # Asked before the frame that failed, a question sees what it would in a whole file.
        if damage is not None and (event.at_s is None or event.at_s >= damage.at_s):
            if isinstance(event, _Poll):
                if event.watch.done:
                    continue
                event.watch.give_up()
            skip = _skip(event.watch.item if isinstance(event, _Poll) else event, str(damage))
            yield from ({**skip, "policy": name} for name, _ in _members(session))
        elif isinstance(event, _Poll):
            record = _poll(session, event)
            if record is not None:
                yield record
        else:
            for name, member in _members(session):
                yield {**_ask(member, event, letter_ids, settings), "policy": name}


def _members(session: StreamingSession | PolicyGroup) -> list[tuple[str | None, StreamingSession]]:
    """(policy, session) for each memory a question is asked of; no policy name for a lone session."""
    if isinstance(session, PolicyGroup):
        return list(session.sessions.items())
    return [(None, session)]


def _by_video(items: list[Item]) -> list[list[Item]]:
    """Questions grouped by (video, start, end), in order of first appearance."""
    groups: dict[tuple, list[Item]] = {}
    for item in items:
        groups.setdefault((item.video, item.start_s, item.end_s), []).append(item)
    return list(groups.values())


def run_eval(
    lm: VideoLM,
    spec: BenchSpec,
    items: list[Item],
    problems: list[Problem],
    session: StreamingSession | PolicyGroup,
    videos: str | Path,
    out: str | Path,
    settings: EvalSettings,
    progress: bool = True,
    shard: Shard | None = None,
) -> dict | None:
    """Score every question not answered yet, appending a record per question; the summary.

    `settings.limit` keeps the first N questions; malformed entries are always reported. With a
    `shard` (default: one process) of several processes, this one streams its share of the videos
    into its own part file (`Shard.part`), and returns None while other shards are still running;
    the one that finds every part complete merges them into `out` and returns the summary of the
    whole evaluation.

    With a `PolicyGroup`, every policy's memory streams the same decoded frames and answers every
    question; each policy's records go to its own file (`policy_out`) and the result is a summary
    per policy. Such a run is not sharded, and proactive tasks (whose polls keep state) are refused.
    """
    from tqdm import tqdm

    items = items[: settings.limit] if settings.limit is not None else items
    shard, out = shard or Shard(), Path(out)
    if isinstance(session, PolicyGroup):
        _check_policy_run(items, shard)
        return _run_policies(lm, spec, items, problems, session, videos, out, settings, progress)
    part = shard.part(out)
    part.parent.mkdir(parents=True, exist_ok=True)
    groups = _by_video(items)
    mine = shard.take(groups)
    own_problems = problems if shard.rank == 0 else []
    done = _answered(part)
    answerer = _Answerer.for_run(lm, spec, items, videos, settings)
    total = sum(len(group) for group in mine)
    left = sum(it.qid not in done for group in mine for it in group)
    bar = tqdm(total=total, initial=total - left, unit="question", disable=not progress, file=sys.stderr)
    with bar, part.open("a", encoding="utf-8") as sink:

        def write(record: dict) -> None:
            record.pop("policy", None)  # a lone session's records name no policy
            sink.write(json.dumps(record) + "\n")
            sink.flush()  # one whole line per question, on disk before the next one starts
            if record["qid"] not in malformed:
                bar.update(1)

        malformed = {p.qid for p in own_problems}
        for problem in own_problems:
            write(_skip(problem, f"malformed entry: {problem.reason}"))
        for video_group in mine:
            answerer.answer_video(session, [it for it in video_group if it.qid not in done], write)
    qids = [it.qid for it in items] + [p.qid for p in problems]
    if not shard.sharded:
        return summarize(read_results(out), qids)
    return _merged_summary(out, shard, groups, problems, qids)


def _check_policy_run(items: list[Item], shard: Shard) -> None:
    """Refuse what a run of several policies in one process cannot do: a shard, or proactive tasks."""
    if shard.sharded:
        raise ValueError("several policies run in one process: launch one sharded run per policy instead")
    if any(isinstance(it, ProactiveItem) for it in items):
        raise ValueError("proactive tasks keep state between polls: evaluate them one policy at a time")


def _answered(path: Path) -> set[str]:
    """The questions that the results file `path` holds an answer to."""
    return {q for q, r in read_results(path).items() if r["status"] == ANSWERED}


@dataclass(frozen=True)
class _Answerer:
    """What answering a video's questions takes besides the memory: where the videos are, the
    token ids of the option letters and the run's settings."""

    finder: VideoFinder
    letter_ids: list[list[int]]
    settings: EvalSettings

    @classmethod
    def for_run(
        cls, lm: VideoLM, spec: BenchSpec, items: list[Item], videos: str | Path, settings: EvalSettings
    ) -> _Answerer:
        letter_ids = letter_token_ids(lm, max((len(it.options) for it in items), default=0))
        return cls(VideoFinder(videos, spec.extensions), letter_ids, settings)

    def answer_video(
        self, session: StreamingSession | PolicyGroup, group: list[Item], write: Callable[[dict], None]
    ) -> None:
        """Stream the video of `group` (its questions, in order; none: nothing to do) and `write` a
        record per question and policy (its "policy", None for a lone session): answered, or
        skipped with the reason (no video, a damaged file, a bound of the policy)."""
        if not group:
            return
        names = [name for name, _ in _members(session)]
        path, why = self.finder.find(group[0])
        if path is None:
            for item in group:
                for name in names:
                    write({**_skip(item, why), "policy": name})
            return
        answered: set[tuple[str | None, str]] = set()
        try:
            whole = self.finder.whole(group[0], path)
            for record in _stream_video(session, path, group, self.letter_ids, self.settings, whole):
                answered.add((record.get("policy"), record["qid"]))  # a proactive task's record names none
                write(record)
        except (VideoError, StreamBound) as exc:  # a damaged file, or rekv's host cap or positions
            for item in group:
                for name in names:
                    if (name, item.qid) not in answered:
                        write({**_skip(item, str(exc)), "policy": name})


def _merged_summary(
    out: Path, shard: Shard, groups: list[list[Item]], problems: list[Problem], qids: list[str]
) -> dict | None:
    """The summary of a sharded run once every shard's part is complete (this one merges them into
    `out`); None while another shard is still streaming."""
    with merge_lock(out):
        parts = [read_results(part_path(out, rank, shard.world), repair=False) for rank in range(shard.world)]
        owned = [(q, shard.owner(i)) for i, group in enumerate(groups) for q in (it.qid for it in group)]
        owned += [(p.qid, 0) for p in problems]
        if not all(q in parts[rank] for q, rank in owned):
            return None  # a shard is still streaming (or stopped): the last one to finish merges
        merged = merge_parts(out, shard.world, parts, [p.qid for p in problems], [[it.qid for it in g] for g in groups])
    return summarize(merged, qids)


def _run_policies(
    lm: VideoLM,
    spec: BenchSpec,
    items: list[Item],
    problems: list[Problem],
    group: PolicyGroup,
    videos: str | Path,
    out: Path,
    settings: EvalSettings,
    progress: bool,
) -> dict[str, dict]:
    """`run_eval` for several policies at once: each video decoded once, every policy's memory fed
    its chunks, each question asked of each memory; a summary per policy."""
    from tqdm import tqdm

    paths = {name: policy_out(out, name) for name in group.sessions}
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    done_by = {name: _answered(path) for name, path in paths.items()}
    done = set.intersection(*done_by.values())  # a question any policy still lacks is asked again of all
    answerer = _Answerer.for_run(lm, spec, items, videos, settings)
    left = [[it for it in g if it.qid not in done] for g in _by_video(items)]
    total = len(items) * len(paths)
    bar = tqdm(total=total, initial=total - sum(map(len, left)) * len(paths), unit="answer", disable=not progress)
    files = {name: path.open("a", encoding="utf-8") for name, path in paths.items()}
    try:

        def write(record: dict) -> None:
            name = record.pop("policy")
            if record["qid"] in done_by[name] and record["status"] == ANSWERED:
                return  # answered before an interruption: the first record stands
            files[name].write(json.dumps(record) + "\n")
            files[name].flush()
            bar.update(1)

        for problem in problems:
            for name in paths:
                write({**_skip(problem, f"malformed entry: {problem.reason}"), "policy": name})
        for group_items in left:
            answerer.answer_video(group, group_items, write)
    finally:
        bar.close()
        for f in files.values():
            f.close()
    qids = [it.qid for it in items] + [p.qid for p in problems]
    return {name: summarize(read_results(path), qids) for name, path in paths.items()}
