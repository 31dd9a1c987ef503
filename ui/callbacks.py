"""Gradio event handlers: thin glue between the page and each viewer's `LiveStream`.

Handlers find the viewer's stream by Gradio's session hash (the same for a browser tab and for a
`gradio_client.Client`), start and steer it, and stream answers out of the worker's tickets. They
never run the model and return quickly; the timer tick redraws only what changed since the last tick.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import anyio
import gradio as gr

from hermes.serving import (
    Alert,
    AnswerEvent,
    AnswerTicket,
    Busy,
    LiveStream,
    LiveView,
    NetworkNumbers,
    PageKeys,
    QuestionError,
    StreamRegistry,
    StreamSettings,
    StreamState,
    StreamStatus,
    TooManyQuestions,
    UrlPolicy,
    VideoError,
    Viewers,
    WatchError,
    bundled_samples,
    keep_up_hint,
    suggestions_markdown,
    unpack_frames,
)
from ui import figures
from ui.stills import still

FRAME_LABEL = "What the model just consumed"
# Questions admitted before their answer's event ran, kept per stream: no more can wait than
# Gradio's queue holds (ui/layout.py, QUEUE_MAX_SIZE), so older ones belong to events that never ran.
ADMITTED_KEPT = 64
# How long a question refused for its viewer's questions in flight waits for its answer (see AskAdmission).
REFUSAL_DELAY_S = 1.0

log = logging.getLogger(__name__)


def refused(message: str) -> gr.Error:
    """The error that refuses a request with `message`, logged as one line (a refusal is no bug:
    Gradio would print its traceback)."""
    log.info("refused: %s", message)
    return gr.Error(message, print_exception=False)


def settings_from(controls: Mapping[str, object]) -> StreamSettings:
    """StreamSettings from the Settings controls' values, named as its fields; gr.Error with the
    reason if they are invalid."""
    try:
        return StreamSettings.from_controls(**controls)
    except (TypeError, ValueError) as exc:
        raise refused(f"Invalid settings: {exc}") from exc


@dataclass(frozen=True)
class LiveOutputs:
    """What the timer redraws, by name: each field is a component of the page (ui/layout.py places
    them), and `Callbacks.tick` returns the new value of those that changed."""

    frame: gr.Image
    status: gr.Markdown
    retained: gr.Plot
    attention: gr.Plot
    performance: gr.Plot
    metrics: gr.JSON
    chat: gr.Chatbot
    watch_plot: gr.Plot

    def components(self) -> list:
        return [getattr(self, f.name) for f in fields(self)]


def printable(text: str) -> str:
    """Answer text with control characters shown as '·' (random-weight models emit raw bytes)."""
    return "".join(c if c.isprintable() or c == "\n" else "·" for c in text)


def inert(text: str) -> str:
    """Text the chat renders as Markdown (an answer, a question) made unable to load anything: no
    HTML tag (each `<` is shown as it is) and no Markdown image (each `![` is shown as it is). The
    page renders an answer's Markdown, and a prompt injection in a video's text could make a real
    model write an image of any URL, which the viewer's browser would then fetch. Links stay
    links: nothing is fetched until one is clicked."""
    return text.replace("<", "&lt;").replace("![", "!\\[")


def answer_message(event: AnswerEvent, compare: bool) -> dict:
    """The chat message of one policy's answer so far; the finished one carries its timings."""
    label = f"**{event.policy.label}** · " if compare else ""
    update = event.update
    text = inert(printable(update.text)) or "…"
    if event.interrupted:
        text += "\n\n*(interrupted: the stream was reset)*"
    elif event.done:
        ttft = f"{update.ttft_ms:.0f} ms" if update.ttft_ms is not None else "n/a"
        if update.retrieval_ms is not None:  # a question-time step's part of TTFT (rekv's retrieval)
            ttft += f" (retrieval {update.retrieval_ms:.0f} ms)"
        text += (
            f"\n\n*TTFT {ttft} · waited {event.wait_ms:.0f} ms for the chunk in flight · "
            f"{update.frames_in_memory} of {update.frames_seen} frames in memory*"
        )
    return {"role": "assistant", "content": label + text}


def alert_message(alert: Alert, compare: bool) -> dict:
    """The chat message of a standing question that fired: marked as an alert, with the stream
    time, p(yes), the short answer and the frame the memory had just seen."""
    label = f" · {alert.policy.label}" if compare else ""
    check, answer = alert.check, alert.answer
    text = (
        f"🔔 **Alert**{label} · {check.at_s:.0f} s (frame {answer.frames_seen - 1}) · p(yes) {check.p_yes:.2f}\n\n"
        f"*{inert(check.question)}* {inert(printable(answer.text)) or '…'}"
    )
    frame = gr.Image(value=still(alert.frame), show_label=False, height=160, buttons=[])
    return {"role": "assistant", "content": [text, frame]}


def watch_choices(watching: list[str], selected: str | None) -> gr.Dropdown:
    """The 'Watching' dropdown listing the standing questions."""
    return gr.Dropdown(choices=watching, value=selected if selected in watching else None)


def frame_image(view: LiveView) -> gr.Image:
    """The frame the model consumed last, labelled with its number and time; none after a reset."""
    if view.frame_image is None:
        return gr.Image(value=None, label=FRAME_LABEL)
    label = f"{FRAME_LABEL}: frame {view.frames_seen - 1} ({view.stream_time_s:.0f} s)"
    return gr.Image(value=still(view.frame_image), label=label)


def error_message(text: str) -> dict:
    return {"role": "assistant", "content": f"⚠️ {text}"}


# Behind by more than this, the status line says that the model cannot keep up with the video.
BEHIND_NOTICE_S = 3.0
KEEP_UP = "a smaller model, a GPU or fewer frames per second would keep up"


def behind_text(status: StreamStatus, view: LiveView, keep_up: str = KEEP_UP) -> str | None:
    """Why the model's picture lags the video, on a slow machine: "the model reads 0.8 frames/s;
    the stream is 12 s behind", and what would keep up (`keep_up`). None while it keeps up."""
    if status.position_s is None:
        return None
    behind = status.position_s - view.stream_time_s
    fps = view.model_fps()
    if behind < BEHIND_NOTICE_S or fps is None or fps >= view.settings.fps:
        return None
    return (
        f"The model reads {fps:.1f} frames/s, slower than the video's {view.settings.fps:g}; "
        f"the stream is {behind:.0f} s behind ({keep_up})."
    )


def clock(seconds: float) -> str:
    """A length as a clock shows it: 0:14, 10:00, 1:02:03."""
    minutes, s = divmod(round(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}:{m:02d}:{s:02d}" if hours else f"{m}:{s:02d}"


def network_text(n: NetworkNumbers) -> str:
    """A network stream's line: glass-to-memory latency, what the model skipped to stay live, drops."""
    parts = []
    if n.latency_s is not None:
        parts.append(f"latency {n.latency_s:.1f} s (camera to memory)")
    if n.skipped_s >= 0.5:
        parts.append(f"the model skipped {n.skipped_s:.0f} s of the stream to stay live")
    if n.reconnects:
        parts.append(
            f"{n.reconnects} reconnect{'s' if n.reconnects > 1 else ''}" + (f", {n.gaps[-1]}" if n.gaps else "")
        )
    return " · ".join(parts)


def status_text(stream: LiveStream) -> str:
    """Two short lines: what the stream is doing, and what the model has seen and kept."""
    status, view = stream.status(), stream.view()
    head = f"**{status.state.capitalize()}**"
    if status.source:
        paced = status.source != "webcam" and status.network is None  # a live source has no pace
        head += f" · {status.source}" + (f" · {status.speed}" if paced else "")
    if status.duration_s is not None:
        head += f" · {clock(status.duration_s)} long"
    if status.state in (StreamState.IDLE, StreamState.STARTING) and not status.source:
        head += " · pick a source and press Start"
    parts = [f"{status.frames_read} frames read", f"{view.frames_seen} seen by the model ({view.stream_time_s:.0f} s)"]
    if status.queued_chunks:
        parts.append(f"{status.queued_chunks} chunk{'s' if status.queued_chunks > 1 else ''} queued")
    if status.dropped_frames and status.network is None:
        parts.append(f"{status.dropped_frames} webcam frames dropped (model busy)")
    for policy, kept in view.frames_in_memory.items():
        parts.append(
            f"{policy.label}: {kept} frames in memory, {view.snapshots[policy].cache_bytes / figures.MB:.1f} MB"
        )
    text = head + "  \n" + " · ".join(parts)
    if (lag := behind_text(status, view, keep_up_hint(stream.lm.source, stream.lm.device.type))) is not None:
        text += f"  \n🐢 {lag}"
    if status.network is not None and (live := network_text(status.network)):
        text += f"  \n📡 {live}"
    if status.skipped:
        text += f"  \n⚠️ {status.skipped}"
    if status.error:
        text += f"  \n⚠️ {status.error}"
    if status.note:
        text += f"  \nℹ️ {status.note}"
    if (checkpoint := stream.files.checkpoint_line()) is not None:
        text += f"  \n💾 {checkpoint}"
    return text


class AskAdmission:
    """The ask events' validator, which Gradio runs as a question arrives, before the question waits
    in its queue for one of the answer slots (ASK_CONCURRENCY in ui/layout.py): a question past its
    viewer's in-flight limit is refused there and takes no slot, so that one viewer's flood cannot
    hold the slots every viewer's answers stream through. A question within the limit is queued for
    the model there, the limit checked and the question counted in one step (questions sent at once
    cannot all pass a check that counts none of them), and `take` hands its ticket to the handler."""

    def __init__(self, stream_of: Callable[[gr.Request], LiveStream]) -> None:
        self._stream_of = stream_of
        self._admitted: weakref.WeakKeyDictionary[LiveStream, list[tuple[str, AnswerTicket]]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    async def validate(self, question: str, request: gr.Request) -> dict:
        """Refuse a question past its viewer's in-flight limit (the page shows why under the question
        box, gradio_client raises ValidationError, REST answers 422), or queue it for the model. Other
        refusals are left to the handler, which shows them in the chat; so is a bare REST call, whose
        session Gradio makes after this runs. A refusal answers after REFUSAL_DELAY_S, waited on the
        event loop: a client that asks again at once is slowed to one refusal a second per request
        in flight, at no cost to anyone (no thread, no slot), instead of taking the server's time."""
        if request.session_hash is None:
            return gr.validate(True, "")
        refusal = await anyio.to_thread.run_sync(self._admit, question, request)
        if refusal is None:
            return gr.validate(True, "")
        await asyncio.sleep(REFUSAL_DELAY_S)
        return gr.validate(False, refusal)

    def _admit(self, question: str, request: gr.Request) -> str | None:
        """Queue `question` for its viewer's stream and keep its ticket; why not, past the limit."""
        stream = self._stream_of(request)
        try:
            ticket = stream.ask(question)
        except TooManyQuestions as exc:
            log.info("refused a question: %s", exc)
            return str(exc)
        except QuestionError:
            return None
        with self._lock:
            admitted = self._admitted.setdefault(stream, [])
            admitted.append((question, ticket))
            del admitted[:-ADMITTED_KEPT]
        return None

    def take(self, stream: LiveStream, question: str) -> AnswerTicket | None:
        """The ticket the validator made for `question` of `stream`'s (None: it made none)."""
        with self._lock:
            admitted = self._admitted.get(stream, [])
            for i, (asked, ticket) in enumerate(admitted):
                if asked == question:
                    del admitted[i]
                    return ticket
        return None


class Callbacks:
    """The app's event handlers, bound to one registry of live streams."""

    def __init__(
        self,
        registry: StreamRegistry,
        viewers: Viewers | None = None,
        urls: UrlPolicy | None = None,
        keys: PageKeys | None = None,
    ) -> None:
        self.registry = registry
        self.viewers = viewers  # the viewers' checkpoints, with a state folder
        # On a cluster, streams are keyed by the key each page's browser keeps (else by page session):
        # a page reloaded, or served by another front end, finds its stream again.
        self.keys = keys
        self.urls = urls or UrlPolicy()  # the network streams viewers may open (default: none)
        self.live: LiveOutputs | None = None  # set by the layout once the page's parts exist
        self.admission = AskAdmission(self.stream_of)  # the ask events' validator
        self.gpu = registry.lm.device.type == "cuda"
        self.samples = bundled_samples(registry.lm)  # title -> Sample; the model's own first
        # Per stream and page session (gone with the stream; a cluster's stream may have several pages,
        # one per tab of its browser): the view version and status text last sent by the timer, and
        # the chat version last sent, by the timer or an answer (see `tick`).
        self._sent: weakref.WeakKeyDictionary[LiveStream, dict[str, tuple[int, str]]] = weakref.WeakKeyDictionary()
        self._sent_chat: weakref.WeakKeyDictionary[LiveStream, dict[str, int]] = weakref.WeakKeyDictionary()
        # The answers streaming into each stream's chat now: while one does, the chat is theirs to send.
        self._answering: weakref.WeakKeyDictionary[LiveStream, int] = weakref.WeakKeyDictionary()
        self._answering_lock = threading.Lock()
        # The number of the next alert each stream's chat has yet to show.
        self._alerts_shown: weakref.WeakKeyDictionary[LiveStream, int] = weakref.WeakKeyDictionary()

    def key(self, request: gr.Request) -> str:
        """The key of the viewer's stream: its page session's, or on a cluster its browser's key."""
        session = request.session_hash or "anonymous"
        return (self.keys and self.keys.key_of(session)) or session

    def stream_of(self, request: gr.Request) -> LiveStream:
        """The viewer's stream (made on first use)."""
        stream = self.registry.get(self.key(request))
        assert stream is not None  # get() creates it
        if self.viewers is not None:  # checkpointed under the key the page's browser keeps
            self.viewers.attach(request.session_hash or "anonymous", stream.files)
        return stream

    # -- sources and controls ---------------------------------------------------------------
    def start_sample(self, sample: str, speed: str, request: gr.Request, **settings: object) -> tuple[str, list, str]:
        """Stream a bundled sample clip into fresh memories with the Settings controls' `settings`;
        returns the status line."""
        if sample not in self.samples:
            raise refused(f"Unknown sample {sample!r}; choose one of: {', '.join(self.samples)}")
        return self._start(self.samples[sample].path, speed, settings_from(settings), request)

    def suggest(self, sample: str) -> str:
        """The chosen sample's suggested questions, for the page."""
        return suggestions_markdown(self.samples[sample]) if sample in self.samples else ""

    def start_file(
        self, video: str | None, speed: str, request: gr.Request, **settings: object
    ) -> tuple[str, list, str]:
        """Stream an uploaded video file (or a zip of frame images, one a frame at the stream's fps)
        into fresh memories with `settings`; returns the status line."""
        if not video:
            raise refused("Upload a video file first (mp4, webm, avi, mov ...), or a zip of frame images.")
        path = Path(video)
        if path.suffix.lower() == ".zip":
            try:  # beside the upload, in Gradio's upload folder: it goes when the upload does
                path = unpack_frames(path, path.with_name(f"{path.stem}-frames"))
            except VideoError as exc:
                raise refused(str(exc)) from exc
        return self._start(path, speed, settings_from(settings), request)

    def _start(self, path: Path, speed: str, settings: StreamSettings, request: gr.Request) -> tuple[str, list, str]:
        stream = self.stream_of(request)
        try:
            if stream.files.resumable is not None:  # a memory loaded from a file: the video goes on in it
                stream.files.go_on(path, speed)
            else:
                stream.start_file(path, speed=speed, settings=settings)
        except (VideoError, Busy, ValueError) as exc:
            raise refused(str(exc)) from exc
        return status_text(stream), [], "Pause"

    def start_url(self, url: str, request: gr.Request, **settings: object) -> tuple[str, list, str]:
        """Watch a network stream (RTSP, RTMP, SRT, HLS, MJPEG, MP4 over HTTP) in fresh memories with
        `settings`, if this server allows its URL; returns the status line. A stream that does not open
        says why within seconds, and a running stream goes on meanwhile."""
        stream = self.stream_of(request)
        try:
            stream.start_url(url or "", self.urls, settings_from(settings))
        except (VideoError, Busy, ValueError) as exc:
            raise refused(str(exc)) from exc
        return status_text(stream), [], "Pause"

    def webcam_frame(self, frame, request: gr.Request, **settings: object) -> None:
        """Feed one webcam frame (the first one starts a webcam stream with `settings`)."""
        if frame is None:
            return
        stream = self.stream_of(request)
        try:
            stream.push_frame(frame, settings_from(settings))
        except (Busy, ValueError) as exc:
            raise refused(str(exc)) from exc

    def set_speed(self, speed: str, request: gr.Request) -> None:
        self.stream_of(request).feed.set_speed(speed)

    def pause(self, request: gr.Request) -> tuple[str, str]:
        """Pause a running stream, or resume a paused one; returns the status and the button label."""
        stream = self.stream_of(request)
        if stream.status().state is StreamState.PAUSED:
            stream.resume()
        else:
            stream.pause()
        label = "Resume" if stream.status().state is StreamState.PAUSED else "Pause"
        return status_text(stream), label

    def stop(self, request: gr.Request) -> str:
        """End the source; what was read reaches the model and questions still work."""
        stream = self.stream_of(request)
        stream.stop()
        return status_text(stream)

    def reset(self, request: gr.Request, **settings: object) -> tuple[str, list, str]:
        """Stop, clear the chat and the memories, and apply `settings`."""
        stream = self.stream_of(request)
        stream.reset(settings_from(settings))
        return status_text(stream), [], "Pause"

    # -- chat -------------------------------------------------------------------------------------
    def ask(self, question: str, request: gr.Request) -> Iterator[tuple[list, object]]:
        """Ask about the stream; yields the chat as the answer streams in, token by token."""
        stream = self.stream_of(request)
        try:
            ticket = self.admission.take(stream, question) or stream.ask(question)
        except QuestionError as exc:
            if not (question or "").strip():  # nothing for the chat to show: the error is the answer
                raise refused(str(exc)) from exc
            gr.Warning(str(exc))
            log.info("refused a question: %s", exc)
            shown = question.strip()
            shown = shown if len(shown) <= 300 else shown[:300] + f"… ({len(shown):,} characters)"
            stream.chat.add({"role": "user", "content": inert(shown)})
            stream.chat.add(error_message(str(exc)))
            yield stream.chat.messages(), gr.skip()
            return
        # Chat writes carry the ticket's generation: after a Reset they land nowhere.
        gen = ticket.generation
        stream.chat.add({"role": "user", "content": inert(ticket.question)}, gen)
        self._count_answering(stream, +1)
        try:
            yield self._chat_out(stream, request), ""
            compare = len(stream.view().settings.policies) > 1
            slots: dict[str, int] = {}
            for event in ticket.events():
                stream.touch()  # an answer being read is a sign of its viewer
                if event.error:
                    stream.chat.add(error_message(event.error), gen)
                    gr.Warning(event.error)
                else:
                    message = answer_message(event, compare)
                    if event.policy not in slots:
                        slots[event.policy] = stream.chat.add(message, gen)
                    else:
                        stream.chat.set(slots[event.policy], message, gen)
                yield self._chat_out(stream, request), gr.skip()
        finally:
            self._count_answering(stream, -1)

    def _count_answering(self, stream: LiveStream, step: int) -> None:
        with self._answering_lock:
            self._answering[stream] = self._answering.get(stream, 0) + step

    def _chat_out(self, stream: LiveStream, request: gr.Request) -> list:
        """The chat to send the page, noted as sent (its version read first: a later write goes out later)."""
        self._sent_chat.setdefault(stream, {})[request.session_hash or "anonymous"] = stream.chat.version
        return stream.chat.messages()

    # -- reading ------------------------------------------------------------------------------
    def metrics(self, request: gr.Request) -> dict:
        """The stream's numbers: frames, cache bytes per policy, memory, and recent answers' timings."""
        return self.stream_of(request).metrics()

    def keepalive(self, request: gr.Request) -> dict:
        """Renew the session's lease (as any request does): its stream's state, and the seconds of
        silence after which it is stopped and its memory freed."""
        stream = self.registry.get(self.key(request), create=False)
        state = "none" if stream is None else str(stream.status().state)
        return {"state": state, "lease_s": self.registry.lease_s}

    def tick(self, request: gr.Request) -> dict:
        """Timer: redraw what changed (frame, status, the plots, metrics) and show new alerts in the
        chat; the parts of `live` that did not change are left out (Gradio keeps them)."""
        key = self.key(request)
        stream = self.registry.get(key, create=False)
        if stream is None:  # none yet, or it lapsed while the page was away (asleep, say): say so once
            note = self.registry.pop_lapsed(key)
            if note is None:
                return gr.skip()
            gr.Warning(note)
            return {self.live.status: f"**Stopped**  \nℹ️ {note}"}
        for notice in stream.pop_notices():
            gr.Warning(notice)
        view, live = stream.view(), self.live
        self._show_alerts(stream, view)
        changed = {}
        # The chat goes out whenever it changed since it was last sent, but not while an answer
        # streams into it: the answer's updates and the timer's are two events, and a timer's older
        # copy that reached the page after the answer's last update took the finished answer back
        # for a tick. An alert that lands meanwhile goes out with the answer's next update.
        session = request.session_hash or "anonymous"
        if not self._answering.get(stream) and stream.chat.version != self._sent_chat.get(stream, {}).get(session):
            changed[live.chat] = self._chat_out(stream, request)
        status = status_text(stream)
        sent = self._sent.setdefault(stream, {})
        version, sent_status = sent.get(session, (-1, ""))
        sent[session] = (view.version, status)
        if status != sent_status:
            changed[live.status] = status
        if view.version != version:
            changed |= {
                live.frame: frame_image(view),
                live.retained: figures.retained_map_figure(view),
                live.attention: figures.attention_figure(view),
                live.performance: figures.performance_figure(view, self.gpu),
                live.metrics: stream.metrics(),
                live.watch_plot: figures.watch_figure(view),
            }
        return changed or gr.skip()

    def _show_alerts(self, stream: LiveStream, view: LiveView) -> None:
        """Add the alerts the page has not shown yet to the chat."""
        compare = len(view.settings.policies) > 1
        shown = self._alerts_shown.get(stream, 0)
        for alert in view.alerts:
            if alert.number >= shown:
                stream.chat.add(alert_message(alert, compare))
        self._alerts_shown[stream] = view.alert_count

    def unload(self, request: gr.Request) -> None:
        """The tab closed: free its stream (memories, queued jobs, reader thread). On a cluster the
        stream stays for its browser's key until its lease lapses, for the page to come back to."""
        if self.keys is None:
            self.registry.close(self.key(request))
        else:
            self.keys.forget(request.session_hash or "anonymous")


class WatchCallbacks:
    """The standing questions' handlers, over the app's `Callbacks` (which find each viewer's stream)."""

    def __init__(self, cb: Callbacks) -> None:
        self.cb = cb

    def watch(self, question: str, request: gr.Request) -> tuple[gr.Dropdown, str]:
        """Add a standing question; returns the list (the new one selected) and clears the box."""
        try:
            watching = self.cb.stream_of(request).watch(question)
        except WatchError as exc:
            raise refused(str(exc)) from exc
        return watch_choices(watching, watching[-1]), ""

    def unwatch(self, question: str | None, request: gr.Request) -> gr.Dropdown:
        """Remove a standing question; returns the list."""
        try:
            watching = self.cb.stream_of(request).unwatch(question or "")
        except WatchError as exc:
            raise refused(str(exc)) from exc
        return watch_choices(watching, None)
