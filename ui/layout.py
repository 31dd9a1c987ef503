"""The HERMES Live page: sources and controls, chat, live memory views and settings."""

from __future__ import annotations

import html
from pathlib import Path

import gradio as gr

from hermes.serving import (
    MAX_COMPARED,
    MAX_STANDING,
    POLICIES,
    SPEEDS,
    StreamRegistry,
    StreamSettings,
    Tier,
    VideoLM,
    layer_tiers,
)
from ui import figures
from ui.callbacks import DEFAULT_SAMPLE, FRAME_LABEL, SAMPLES, Callbacks

CSS_PATH = Path(__file__).resolve().parent.parent / "assets" / "style.css"
TICK_S = 1.0
# Gradio limits. The model thread runs one job at a time whatever Gradio does, so these bound the
# threads and requests waiting on it. Quick handlers (controls, ticks, webcam frames) return at
# once and run without a limit; an answer holds a thread while it streams, so at most
# ASK_CONCURRENCY answers stream at once and later questions wait in Gradio's queue, which refuses
# requests beyond QUEUE_MAX_SIZE ("the queue is full").
QUEUE_MAX_SIZE = 64
ASK_CONCURRENCY = 8
DEFAULT_CONCURRENCY = 4  # events without their own limit (the tab-closed handler)
MAX_UPLOAD = "200mb"  # larger uploads are refused by Gradio before they reach the app
# What the upload box takes: any video/* type, animated GIFs, and the phone and camcorder extensions
# that Python's mime table leaves out or files as something else (.3gp as audio, .mts as a 3D model).
UPLOAD_TYPES = ["video", ".gif", ".3gp", ".3g2", ".mts", ".m2ts", ".ts"]

MAP_CAPTION = (
    "**Retained-token map.** Each row is a decoder layer (shallow at the bottom, deep at the top); each column "
    "is a stretch of the stream, oldest on the left. The colour is the share of that stretch's visual tokens "
    "the layer still keeps in its KV cache. The coloured bands on the left mark the memory tiers. HERMES lets "
    "shallow layers (sensory memory) keep the recent past, deep layers (long-term memory) keep anchors "
    "scattered over the whole stream, and middle layers (working memory) blend both. FIFO keeps only the "
    "newest frames, in every layer alike."
)
ATTENTION_CAPTION = (
    "**Attention profile** (the paper's Figure 2, live). While the video streams, nobody has asked anything "
    "yet, so HERMES asks a *guidance prompt* instead and measures how much it attends to each cached video "
    "slot, here for a shallow, a middle and a deep layer at the last compression (oldest slots left; sensory "
    "layers score by recency alone, so the shallowest measured one is the first of working memory). In "
    "trained models shallower layers look mostly at recent slots and deep layers at a few anchors; HERMES "
    "scores tokens to match. Each point is the largest weight among neighbouring slots."
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


def model_line(lm: VideoLM, settings: StreamSettings) -> str:
    """One line about the model: name, architecture, layers per tier (as the memories of
    `settings` split them), device (the devices of its layers, when spread over several) and dtype."""
    tiers = layer_tiers(lm, settings)
    counts = " / ".join(f"{tiers.count(t)} {t.value}" for t in Tier)
    weights = "random weights" if lm.random_weights else "trained weights"
    devices = lm.devices
    where = lm.device.type if len(devices) == 1 else "layers on " + ", ".join(map(str, devices))
    return (
        f"Model `{lm.source}` · {lm.arch} · {lm.num_layers} layers ({counts}) · {weights} · {where} · {lm.dtype_name}"
    )


def random_weights_banner(lm: VideoLM, load_error: str | None = None) -> str | None:
    """The warning shown on every page while the model has random weights (None otherwise)."""
    if not lm.random_weights:
        return None
    why = ""
    if load_error:
        why = (
            f"The requested model could not be loaded, so the app runs <code>{html.escape(lm.source)}</code> "
            f"instead: a model of the same architecture ({lm.num_layers} layers) with random weights."
            f"<div class='banner-reason'>{html.escape(load_error)}</div>"
        )
    return (
        "<div class='banner'><strong>⚠️ Random weights: the answers are noise; the memory dynamics are real.</strong> "
        "What each layer keeps, the latency and the memory are measured for real, but random weights show "
        "none of the attention patterns of a trained model (recency in shallow layers, anchors in deep ones). "
        f"{why}</div>"
    )


def launch_options(max_file_size: str | int = MAX_UPLOAD) -> dict:
    """Theme, CSS (Gradio 6 takes them in launch(), not in Blocks()) and the upload size limit."""
    theme = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate")
    return {"theme": theme, "css_paths": [CSS_PATH], "max_file_size": max_file_size}


def build_app(
    lm: VideoLM,
    *,
    settings: StreamSettings | None = None,
    registry: StreamRegistry | None = None,
    load_error: str | None = None,
    max_streams: int = 4,
    memory_cap_bytes: int | None = None,
) -> gr.Blocks:
    """The Blocks app. Pass `registry` to keep a handle on the viewers' streams (tests shut it down);
    otherwise one is made with `max_streams` and `memory_cap_bytes` (see StreamRegistry)."""
    if registry is None:
        registry = StreamRegistry(lm, settings=settings, max_streams=max_streams, memory_cap_bytes=memory_cap_bytes)
    s = registry.settings
    cb = Callbacks(registry)
    banner = random_weights_banner(lm, load_error)

    # Gradio keeps files it serves (frames shown) in its cache: clear them every 10 min, after 30.
    with gr.Blocks(title="HERMES Live", delete_cache=(600, 1800)) as demo:
        gr.HTML(
            "<div class='hero'><h1>HERMES Live</h1><p>Chat with a video while it plays. The video streams into "
            "a video LLM chunk by chunk; its KV cache is kept at a fixed size as a <em>hierarchical memory</em> "
            "(HERMES, arXiv 2601.14724), so answers come at once, however long the stream.</p>"
            f"<p class='model-line'>{html.escape(model_line(lm, s)).replace('`', '')}</p></div>"
        )
        if banner:
            gr.HTML(banner)
        with gr.Row(equal_height=False):
            with gr.Column(scale=5, min_width=340):
                with gr.Tabs():
                    with gr.Tab("Sample clip"):
                        sample = gr.Dropdown(list(SAMPLES), value=DEFAULT_SAMPLE, label="Bundled clip")
                        start_sample = gr.Button("▶ Stream the sample", variant="primary", elem_id="start-sample")
                    with gr.Tab("Upload"):
                        upload = gr.File(label="Video file", file_types=UPLOAD_TYPES, type="filepath", height=120)
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
                speed = gr.Radio(
                    list(SPEEDS),
                    value="1x",
                    label="Pace",
                    info="1x plays the file in real time; max as fast as the model goes",
                )
                with gr.Row():
                    pause = gr.Button("Pause", size="sm", elem_id="pause")
                    stop = gr.Button("Stop", size="sm", elem_id="stop")
                    reset = gr.Button("Reset", size="sm", elem_id="reset")
                frame = gr.Image(
                    label=FRAME_LABEL, interactive=False, height=230, format="jpeg", buttons=[], elem_id="frame"
                )
                status = gr.Markdown("**Idle** · pick a source and press Start", elem_id="status", label="status")
                with gr.Accordion("Settings (applied at the next Start or Reset)", open=False):
                    policy = gr.Dropdown(
                        list(POLICIES),
                        value=s.policy,
                        label="Memory policy",
                        info="hermes: hierarchical memory · fifo: newest tokens only · full: no eviction · "
                        "sink: first tokens + window · infinipot-v: redundancy + value norm · streammem: "
                        "template attention + frame prototypes · rekv: a window, every frame in host memory, "
                        "retrieval per question · simplestream: the last 4 frames only · "
                        "+dtd: drop static patches before the model",
                        elem_id="policy",
                    )
                    compare = gr.Checkbox(
                        value=s.compare, label="Compare policies side by side (one cache each)", elem_id="compare"
                    )
                    compare_policies = gr.Dropdown(
                        list(POLICIES),
                        value=list(s.compare_policies),
                        multiselect=True,
                        max_choices=MAX_COMPARED,
                        label=f"Policies to compare (2 to {MAX_COMPARED})",
                        elem_id="compare-policies",
                    )
                    budget = gr.Slider(
                        128, 10240, value=s.budget, step=1, label="Budget |M| (video tokens kept per layer)"
                    )
                    chunk_frames = gr.Slider(1, 32, value=s.chunk_frames, step=1, label="Chunk size (frames)")
                    fps = gr.Slider(0.25, 4, value=s.fps, step=0.25, label="Sampling rate (frames per second)")
                    reindex = gr.Radio(
                        ["lazy", "eager"],
                        value=s.reindex,
                        label="Position re-indexing",
                        info="lazy: compact positions only when they run out · eager: after every eviction",
                    )
                    watch_threshold = gr.Slider(
                        0.05,
                        0.95,
                        value=s.watch_threshold,
                        step=0.05,
                        label="Alert threshold: p(yes) above which a standing question fires",
                        elem_id="watch-threshold",
                    )
            with gr.Column(scale=7, min_width=400):
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
                gr.Examples(
                    ["What is happening right now?", "What did you see at the start?", "Describe the main subject."],
                    inputs=question,
                    label="Try",
                )
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

        settings_inputs = [policy, budget, chunk_frames, fps, reindex, compare, compare_policies, watch_threshold]
        quick = {"concurrency_limit": None, "show_progress": "hidden"}
        start_outputs = [status, chatbot, pause]
        start_sample.click(
            cb.start_sample, [sample, speed, *settings_inputs], start_outputs, api_name="start_sample", **quick
        )
        start_upload.click(
            cb.start_file, [upload, speed, *settings_inputs], start_outputs, api_name="start_file", **quick
        )
        pause.click(cb.pause, None, [status, pause], api_name="pause", **quick)
        stop.click(cb.stop, None, status, api_name="stop", **quick)
        reset.click(cb.reset, settings_inputs, start_outputs, api_name="reset", **quick)
        speed.change(cb.set_speed, speed, None, api_visibility="private", **quick)
        # Both ways of asking share one limit (one concurrency_id).
        asking = {"concurrency_limit": ASK_CONCURRENCY, "concurrency_id": "ask", "show_progress": "minimal"}
        ask.click(cb.ask, question, [chatbot, question], api_name="ask", **asking)
        question.submit(cb.ask, question, [chatbot, question], api_visibility="private", **asking)
        refresh.click(cb.metrics, None, metrics, api_name="metrics", **quick)
        watch.click(cb.watch, watch_question, [watching, watch_question], api_name="watch", **quick)
        watch_question.submit(cb.watch, watch_question, [watching, watch_question], api_visibility="private", **quick)
        unwatch.click(cb.unwatch, watching, watching, api_name="unwatch", **quick)
        webcam.stream(
            cb.webcam_frame,
            [webcam, *settings_inputs],
            None,
            stream_every=0.5,
            concurrency_limit=None,
            api_visibility="private",
        )
        timer = gr.Timer(TICK_S)
        timer.tick(
            cb.tick,
            None,
            [frame, status, retained, attention, performance, metrics, chatbot, watch_plot],
            api_visibility="private",
            **quick,
        )
        demo.unload(cb.unload)
    demo.queue(max_size=QUEUE_MAX_SIZE, default_concurrency_limit=DEFAULT_CONCURRENCY)
    return demo
