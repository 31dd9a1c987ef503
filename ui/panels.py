"""The parts of the HERMES Live page, each built by one function and returned by name: the sources
and controls, the Settings controls (named as `StreamSettings`'s fields), the chat with its
standing questions, and the live views of the memory. ui/layout.py puts them together and wires
them to the event handlers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import gradio as gr

from hermes.serving import (
    LIVE_SCHEMES,
    MAX_COMPARED,
    MAX_STANDING,
    SPEEDS,
    Bound,
    Sample,
    StreamSettings,
    UrlPolicy,
    policy_help,
    policy_names,
    setting_bounds,
    suggestions_markdown,
)
from ui import figures
from ui.callbacks import FRAME_LABEL, LiveOutputs, refused

# What the upload box takes: any video/* type, animated GIFs, and the phone and camcorder extensions
# that Python's mime table leaves out or files as something else (.3gp as audio, .mts as a 3D model).
# A zip of frame images streams as a folder of frames would (one image a frame at the stream's fps).
UPLOAD_TYPES = ["video", ".gif", ".3gp", ".3g2", ".mts", ".m2ts", ".ts", ".zip"]

MAP_CAPTION = (
    "**Retained-token map.** Each row is a decoder layer (shallow at the bottom, deep at the top); each column "
    "is a stretch of the stream, oldest on the left. The colour is the share of that stretch's visual tokens "
    "the layer still keeps in its KV cache. The coloured bands on the left mark the memory tiers. HERMES lets "
    "shallow layers (sensory memory) keep the recent past, deep layers (long-term memory) keep anchors "
    "scattered over the whole stream, and middle layers (working memory) blend both. FIFO keeps only the "
    "newest frames, in every layer alike. With the toy model (trained here on the toy clips), compare HERMES "
    "with FIFO on a toy clip: where FIFO's rows are empty on the left, its answers about the first objects "
    "are guesses; where HERMES's deep rows still hold early columns, it can answer them."
)
ATTENTION_CAPTION = (
    "**Attention profile** (the paper's Figure 2, live). While the video streams, nobody has asked anything "
    "yet, so HERMES asks a *guidance prompt* instead and measures how much it attends to each cached video "
    "slot, here for a shallow, a middle and a deep layer at the last compression (oldest slots left; sensory "
    "layers score by recency alone, so the shallowest measured one is the first of working memory). In "
    "trained models shallower layers look mostly at recent slots and deep layers at a few anchors; HERMES "
    "scores tokens to match. Each point is the largest weight among neighbouring slots. StreamMem measures "
    "attention too, from the chat template's own tokens, in every layer: it is shown when HERMES is not running. "
    "A random-weight model's profile is noise. The first toy model's is a trained model's attention, but the "
    "guidance prompt's words are unknown to it (it learnt only its world's words), so before the first question "
    "its profile shows where a trained model looks when it cannot read the prompt; after a question, the prompt "
    "carries that question and its answer, and the profile follows them. The second toy model (`toy2`) was "
    "trained on the prompts' own tasks."
)


def attention_note(layers: dict[str, list[float]]) -> str:
    """What the served model's card says of where its questions look, per layer (measured with the full
    cache by `python -m hermes toyworld layers --card`), in a line for the attention panel; '' unmeasured."""
    if not layers:
        return ""

    def extremes(values: list[float]) -> str:
        top, low = max(range(len(values)), key=values.__getitem__), min(range(len(values)), key=values.__getitem__)
        return f"most in layer {top} ({values[top]:.2f}x), least in layer {low} ({values[low]:.2f}x)"

    said = "; ".join(f"{name}: {extremes(values)}" for name, values in layers.items() if values)
    return (
        f"**Where this model's questions look**, measured over {len(next(iter(layers.values())))} layers with the "
        "full cache (the lift: a layer's attention to a part of the stream over that part's share of the tokens; "
        f"1 is even): {said}. The paper's split expects recency in the shallow layers and the evidence in the "
        "deep ones; set it beside the tiers of the retained-token map above."
    )


PERFORMANCE_CAPTION = (
    "**Latency and memory.** Left: the time to first token of each answer against the frames seen when it "
    "was asked. It stays flat because answers read a fixed-size cache and recompute nothing. Right: the KV "
    "cache grows until it holds the budget |M| (dashed line), then stays flat however long the stream runs; "
    "the full-cache policy keeps growing. The dotted line is the memory of the whole process (or of the "
    "GPU), model weights included."
)
WATCH_CAPTION = (
    "**Standing questions.** Each line is a yes/no question the stream watches for. After every chunk the model "
    "reads it against its compact memory, exactly as it reads a question you type, and the line shows how much "
    "more likely its answer starts with *Yes* than with *No*: p(yes). When a line rises above the dashed "
    "threshold, a star marks the moment and an alert with that frame appears in the chat. It fires again only "
    "after falling back below (hysteresis), so a scene that stays true alerts once. A check is one forward pass "
    "over the question's few tokens, a small fraction of a chunk's prefill, which is why the memory can be asked "
    "after every chunk. With random weights the lines hover around 0.5."
)


@dataclass(frozen=True)
class Sources:
    """Where a stream comes from, and the controls that steer it."""

    sample: gr.Dropdown
    suggestions: gr.Markdown
    start_sample: gr.Button
    upload: gr.File
    start_upload: gr.Button
    webcam: gr.Image
    url: gr.Textbox
    start_url: gr.Button
    speed: gr.Radio
    pause: gr.Button
    stop: gr.Button
    reset: gr.Button


@dataclass(frozen=True)
class Chat:
    """The chat, and the standing questions under it."""

    chatbot: gr.Chatbot
    question: gr.Textbox
    ask: gr.Button
    watch_question: gr.Textbox
    watch: gr.Button
    watching: gr.Dropdown
    unwatch: gr.Button
    watch_plot: gr.Plot


@dataclass(frozen=True)
class Memory:
    """The live views of the memory, and the raw metrics."""

    retained: gr.Plot
    attention: gr.Plot
    performance: gr.Plot
    metrics: gr.JSON
    refresh: gr.Button


def sources(samples: dict[str, Sample], urls: UrlPolicy) -> Sources:
    """The source tabs (sample clip with its suggested questions, upload, webcam, a live URL that
    `urls` may allow), the pace and the stream's controls."""
    first = next(iter(samples))
    with gr.Tabs():
        with gr.Tab("Sample clip"):
            sample = gr.Dropdown(list(samples), value=first, label="Bundled clip")
            start_sample = gr.Button("▶ Stream the sample", variant="primary", elem_id="start-sample")
            suggestions = gr.Markdown(suggestions_markdown(samples[first]), elem_id="suggestions")
        with gr.Tab("Upload"):
            upload = gr.File(
                label="Video file, or a .zip of frames", file_types=UPLOAD_TYPES, type="filepath", height=120
            )
            start_upload = gr.Button("▶ Stream the upload", variant="primary", elem_id="start-upload")
        with gr.Tab("Webcam"):
            webcam = gr.Image(
                sources=["webcam"],
                streaming=True,
                type="numpy",
                label="Webcam",
                webcam_options=gr.WebcamOptions(mirror=False),
            )
            gr.Markdown("Start the webcam: its frames stream into the memory at the set fps.")
        url, start_url = live_url(urls)
    speed = gr.Radio(
        list(SPEEDS), value="1x", label="Pace", info="1x plays the file in real time; max as fast as the model goes"
    )
    with gr.Row():
        pause = gr.Button("Pause", size="sm", elem_id="pause")
        stop = gr.Button("Stop", size="sm", elem_id="stop")
        reset = gr.Button("Reset", size="sm", elem_id="reset")
    return Sources(
        sample, suggestions, start_sample, upload, start_upload, webcam, url, start_url, speed, pause, stop, reset
    )


def live_url(urls: UrlPolicy) -> tuple[gr.Textbox, gr.Button]:
    """The Live URL tab: a network stream's address, and its Start button (what this server opens, said)."""
    with gr.Tab("Live URL"):
        url = gr.Textbox(
            label="Stream URL",
            placeholder="rtsp://camera.example.com/live, https://example.com/stream.m3u8",
            max_lines=1,
            elem_id="stream-url",
        )
        start = gr.Button("▶ Watch the stream", variant="primary", elem_id="start-url")
        if not urls.enabled:
            where = "This server opens no network streams: start it with `--allow-urls` to allow them."
        elif urls.allowed:
            where = f"This server opens streams from: {', '.join(urls.allowed)}."
        else:
            where = "This server opens streams from public addresses."
        gr.Markdown(
            f"{', '.join(LIVE_SCHEMES)}: an IP camera, an HLS playlist, MJPEG or MP4 over HTTP. A live stream is "
            f"never paced: when the model falls behind it skips to the newest frames. {where}"
        )
    return url, start


def now_showing() -> tuple[gr.Image, gr.Markdown]:
    """The frame the model consumed last, and the status line under it."""
    frame = gr.Image(label=FRAME_LABEL, interactive=False, height=230, buttons=[], elem_id="frame")
    status = gr.Markdown("**Idle** · pick a source and press Start", elem_id="status", label="status")
    return frame, status


def setting_slider(setting: str, bound: Bound, **kwargs: object) -> gr.Slider:
    """A Settings slider over `bound` that checks what an API call sends before Gradio compares it
    with the bounds (which fails opaquely on a string): an error naming the setting and what it
    takes. The check wraps this slider's own preprocess (a subclass of a Gradio component writes a
    .pyi stub beside its module when the class is made)."""
    slider = gr.Slider(bound.low, bound.high, **kwargs)
    preprocess = slider.preprocess

    def checked(payload: float) -> float:
        try:
            bound.check(setting, payload)
        except ValueError as exc:
            raise refused(f"Invalid settings: {exc}") from None
        return preprocess(payload)

    slider.preprocess = checked
    return slider


# The settings a viewer sets, in the order of their fields: the order the API takes them in (the
# positions a memory may use and the host memory cap are the server's).
SETTING_CONTROLS = tuple(f.name for f in fields(StreamSettings) if f.name not in ("max_positions", "host_cap_mb"))


def settings_controls(s: StreamSettings) -> dict[str, gr.components.Component]:
    """The Settings controls, keyed by the `StreamSettings` field each one sets, showing `s`."""
    bounds = setting_bounds(s)  # the same bounds hold a memory file loaded into a stream
    with gr.Accordion("Settings (applied at the next Start or Reset)", open=False):
        names = list(policy_names())
        controls = {
            "policy": gr.Dropdown(
                names, value=str(s.policy), label="Memory policy", info=policy_help(), elem_id="policy"
            ),
            "compare": gr.Checkbox(
                value=s.compare, label="Compare policies side by side (one cache each)", elem_id="compare"
            ),
            "compare_policies": gr.Dropdown(
                names,
                value=[str(p) for p in s.compare_policies],
                multiselect=True,
                max_choices=MAX_COMPARED,
                label=f"Policies to compare (2 to {MAX_COMPARED})",
                elem_id="compare-policies",
            ),
            "budget": setting_slider(
                "budget", bounds["budget"], value=s.budget, step=1, label="Budget |M| (video tokens kept per layer)"
            ),
            "chunk_frames": setting_slider(
                "chunk_frames", bounds["chunk_frames"], value=s.chunk_frames, step=1, label="Chunk size (frames)"
            ),
            "fps": setting_slider(
                "fps", bounds["fps"], value=s.fps, step=0.25, label="Sampling rate (frames per second)"
            ),
            "reindex": gr.Radio(
                ["lazy", "eager"],
                value=s.reindex,
                label="Position re-indexing",
                info="lazy: compact positions only when they run out · eager: after every eviction",
            ),
            "watch_threshold": setting_slider(
                "watch_threshold",
                bounds["watch_threshold"],
                value=s.watch_threshold,
                step=0.05,
                label="Alert threshold: p(yes) above which a standing question fires",
                elem_id="watch-threshold",
            ),
            "guidance_history": gr.Checkbox(
                value=s.guidance_history,
                label="Guide the memory by the last question and answer",
                info="HERMES: after an answer, its guidance prompt starts with the question and answer, so "
                "the memory keeps what was asked about; off, each compression costs less (the prompt is a "
                "third as long)",
                elem_id="guidance-history",
            ),
            "params": params_box(s),
        }
    return {name: controls[name] for name in SETTING_CONTROLS}


def params_box(s: StreamSettings) -> gr.Textbox:
    """The policies' parameters of `s`, as text the command line's --param takes, item by item."""
    return gr.Textbox(
        value=" ".join(s.params),
        label="Policy parameters",
        placeholder="rekv.top_k=8 hermes.keep_newest=true",
        info="part.field=value, space-separated: constants of the policies' parts, as the command line's "
        "--param takes them (a loaded memory's show here)",
        elem_id="params",
    )


def settings_values(s: StreamSettings) -> tuple:
    """`s` as the Settings controls hold it, in their order (`SETTING_CONTROLS`)."""
    shown = {"policy": str(s.policy), "compare_policies": [str(p) for p in s.compare_policies]}
    shown["params"] = " ".join(s.params)
    return tuple(shown.get(name, getattr(s, name)) for name in SETTING_CONTROLS)


# The Try chips of a model whose card suggests none: a real model reads any wording.
GENERAL_QUESTIONS = ("What is happening right now?", "What did you see at the start?", "Describe the main subject.")


def chat(questions: Sequence[str] = ()) -> Chat:
    """The chat, the question box (its Try chips: `questions`, the served model's own, else general
    ones), and the standing questions with their plot."""
    chatbot = gr.Chatbot(
        label="Chat about the stream",
        height=470,
        elem_id="chat",
        buttons=["copy"],
        feedback_options=None,
        placeholder="Start a stream, then ask at any moment: answers come from the compact memory.",
    )
    with gr.Row():
        question = gr.Textbox(
            placeholder="Ask about the video…",
            label="question",
            show_label=False,
            scale=5,
            max_lines=4,
            elem_id="question",
        )
        ask = gr.Button("Ask", variant="primary", scale=1, min_width=80, elem_id="ask")
    gr.Examples(list(questions or GENERAL_QUESTIONS), inputs=question, label="Try")
    with gr.Group(elem_id="watch-box"):
        gr.Markdown(
            f"**Watch for** · up to {MAX_STANDING} yes/no questions, asked after every chunk: "
            "the chat alerts you when one turns to yes."
        )
        with gr.Row():
            watch_question = gr.Textbox(
                placeholder="e.g. Is the bird flying?",
                label="standing question",
                show_label=False,
                scale=5,
                max_lines=2,
                elem_id="watch-question",
            )
            watch = gr.Button("Watch", scale=1, min_width=80, elem_id="watch")
        with gr.Row():
            watching = gr.Dropdown(
                [],
                value=None,
                label="Watching",
                allow_custom_value=True,  # so that removing an unknown one gets our message
                scale=5,
                elem_id="watching",
            )
            unwatch = gr.Button("Stop watching", scale=1, min_width=80, elem_id="unwatch")
    watch_plot = gr.Plot(
        figures.placeholder("Add a question under 'Watch for': its p(yes) per chunk appears here.", 300),
        show_label=False,
        elem_id="watch-plot",
    )
    gr.Markdown(WATCH_CAPTION, elem_classes="caption")
    return Chat(chatbot, question, ask, watch_question, watch, watching, unwatch, watch_plot)


def memory(layers: dict[str, list[float]] | None = None) -> Memory:
    """Inside the memory: the retained-token map, the attention profile (with what the served model's
    card says of its layers, `layers`), latency and memory, and the raw metrics."""
    gr.Markdown("## Inside the memory", elem_classes="section-title")
    retained = gr.Plot(
        figures.placeholder("Start a stream: each layer's retained tokens appear here."),
        show_label=False,
        elem_id="retained-map",
    )
    gr.Markdown(MAP_CAPTION, elem_classes="caption")
    with gr.Row(equal_height=False):
        with gr.Column():
            attention = gr.Plot(
                figures.placeholder("Guidance attention appears at the first compression.", 330),
                show_label=False,
                elem_id="attention",
            )
            gr.Markdown(ATTENTION_CAPTION, elem_classes="caption")
            if note := attention_note(layers or {}):
                gr.Markdown(note, elem_classes="caption", elem_id="model-layers")
        with gr.Column():
            performance = gr.Plot(
                figures.placeholder("TTFT and memory appear as the stream runs.", 330),
                show_label=False,
                elem_id="performance",
            )
            gr.Markdown(PERFORMANCE_CAPTION, elem_classes="caption")
    with gr.Accordion("Raw metrics (also at the API's /metrics)", open=False):
        metrics = gr.JSON(label="metrics")
        refresh = gr.Button("Refresh", size="sm")
    return Memory(retained, attention, performance, metrics, refresh)


def live_outputs(frame: gr.Image, status: gr.Markdown, talk: Chat, inside: Memory) -> LiveOutputs:
    """The parts the timer redraws, by name."""
    return LiveOutputs(
        frame=frame,
        status=status,
        retained=inside.retained,
        attention=inside.attention,
        performance=inside.performance,
        metrics=inside.metrics,
        chat=talk.chatbot,
        watch_plot=talk.watch_plot,
    )
