"""The HERMES Live page: sources and controls, chat, live memory views and settings."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.block_function import BlockFunction

from hermes.serving import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_PREPARING,
    CheckpointStore,
    PageKeys,
    StreamRegistry,
    StreamSettings,
    Tier,
    UrlPolicy,
    VideoLM,
    Viewers,
    layer_tiers,
)
from ui import panels
from ui.callbacks import Callbacks, WatchCallbacks
from ui.memory_files import FileCallbacks, files_panel, wire_files

CSS_PATH = Path(__file__).resolve().parent.parent / "assets" / "style.css"
TICK_S = 1.0
# Gradio limits. The model thread runs one job at a time whatever Gradio does, so these bound the
# threads and requests waiting on it. Quick handlers (controls, ticks, webcam frames) return at
# once and run without a limit; an answer holds a thread while it streams, so at most
# ASK_CONCURRENCY answers stream at once and later questions wait in Gradio's queue, which refuses
# requests beyond QUEUE_MAX_SIZE ("the queue is full"). Starts (which decode a file's first frames)
# run at most DEFAULT_MAX_PREPARING at once, as the registry prepares them.
QUEUE_MAX_SIZE = 64
ASK_CONCURRENCY = 8
DEFAULT_CONCURRENCY = 4  # events without their own limit (the tab-closed handler)
MAX_UPLOAD = "200mb"  # larger uploads are refused by Gradio before they reach the app


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


def model_banner(lm: VideoLM, load_error: str | None = None) -> str | None:
    """The note shown on every page when the model is not the one asked for or cannot answer for
    real: random weights (a warning), or a stand-in with a card saying what it knows; None otherwise."""
    if lm.random_weights:
        return random_weights_banner(lm, load_error)
    if not load_error:
        return None
    about = f": {html.escape(lm.card.about)}" if lm.card.about else ""
    return (
        f"<div class='banner banner-info'><strong>The requested model could not be loaded, so the app runs "
        f"<code>{html.escape(lm.source)}</code> instead</strong>{about}. Its answers about the toy-world "
        "clips are right or wrong, and its attention is a trained model's; a real model stays the default "
        f"whenever it can be loaded.<div class='banner-reason'>{html.escape(load_error)}</div></div>"
    )


def random_weights_banner(lm: VideoLM, load_error: str | None = None) -> str | None:
    """The warning shown on every page while the model has random weights (None otherwise)."""
    if not lm.random_weights:
        return None
    why = ""
    if load_error:
        why = (
            f"The requested model could not be loaded, and neither could the toy models trained here, so the app "
            f"runs <code>{html.escape(lm.source)}</code> instead: a model of the same architecture "
            f"({lm.num_layers} layers) with random weights.<div class='banner-reason'>{html.escape(load_error)}</div>"
        )
    return (
        "<div class='banner'><strong>⚠️ Random weights: the answers are noise; the memory dynamics are real.</strong> "
        "What each layer keeps, the latency and the memory are measured for real, but random weights show "
        "none of the attention patterns of a trained model (recency in shallow layers, anchors in deep ones). "
        f"{why}</div>"
    )


class Page(gr.Blocks):
    """The app's Blocks, whose API calls may leave out trailing inputs that have a default. Gradio's
    API page and gradio_client send every input (the client fills in the defaults the API's schema
    gives), but a bare REST call that sends what it means to set (`/call/start_file` with the file
    and the speed) failed with `{"error": null}`: Gradio refuses a short list of inputs before any
    handler runs. Here each input left out takes the default that schema gives (its component's
    value on the page; None where it has none, which its handler refuses, naming it)."""

    def validate_inputs(self, block_fn: BlockFunction, inputs: list[Any]) -> None:
        """Fill in the defaults of the inputs left out (in place: Gradio reads `inputs` on), then
        Gradio's own check."""
        inputs.extend(block.get_config().get("value") for block in block_fn.inputs[len(inputs) :])
        super().validate_inputs(block_fn, inputs)


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
    checkpoints: CheckpointStore | None = None,
    lease_s: float = DEFAULT_LEASE_S,
    urls: UrlPolicy | None = None,
    browser_secret: str | None = None,
) -> gr.Blocks:
    """The Blocks app. Pass `registry` to keep a handle on the viewers' streams (tests shut it down);
    otherwise one is made with `max_streams`, `memory_cap_bytes` and `lease_s` (see StreamRegistry).
    With `checkpoints`, each viewer's memory is checkpointed there and offered back after a restart;
    `urls`: the network streams viewers may open (default: none). With `browser_secret` (a cluster's
    front end) each stream is keyed by the key its viewer's browser keeps, encrypted with it."""
    if registry is None:
        registry = StreamRegistry(
            lm, settings=settings, max_streams=max_streams, memory_cap_bytes=memory_cap_bytes, lease_s=lease_s
        )
    s = registry.settings
    keys = None if browser_secret is None else PageKeys()
    cb = Callbacks(registry, None if checkpoints is None else Viewers(checkpoints), urls, keys)
    banner = model_banner(lm, load_error)

    # Gradio keeps files it serves (frames shown) in its cache: clear them every 10 min, after 30.
    with Page(title="HERMES Live", delete_cache=(600, 1800)) as demo:
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
                source = panels.sources(cb.samples, cb.urls)
                frame, status = panels.now_showing()
                controls = panels.settings_controls(s)
                files = files_panel(checkpoints, browser_secret)
            with gr.Column(scale=7, min_width=400):
                talk = panels.chat(lm.card.questions)
        inside = panels.memory(lm.card.layers)
        cb.live = panels.live_outputs(frame, status, talk, inside)
        _wire(cb, source, controls, talk, inside)
        demo.unload(cb.unload)
        wire_files(demo, files, FileCallbacks(cb), status, talk.chatbot, controls)
    demo.queue(max_size=QUEUE_MAX_SIZE, default_concurrency_limit=DEFAULT_CONCURRENCY)
    return demo


def _wire(
    cb: Callbacks,
    source: panels.Sources,
    controls: dict[str, gr.components.Component],
    talk: panels.Chat,
    inside: panels.Memory,
) -> None:
    """Bind the page's parts to the handlers. The Settings controls reach a handler by name, as the
    `StreamSettings` fields they set."""
    quick = {"concurrency_limit": None, "show_progress": "hidden"}
    started = [cb.live.status, talk.chatbot, source.pause]
    settings = {"inputs_kwargs": controls}
    source.sample.change(cb.suggest, source.sample, source.suggestions, api_name=False, **quick)
    # Starts decode a file's first frames: at most the registry's preparing bound at once, the rest
    # wait in Gradio's queue (holding no thread) instead of being told "Busy".
    starting = {"concurrency_limit": DEFAULT_MAX_PREPARING, "concurrency_id": "start", "show_progress": "hidden"}
    source.start_sample.click(
        cb.start_sample, [source.sample, source.speed], started, api_name="start_sample", **settings, **starting
    )
    source.start_upload.click(
        cb.start_file, [source.upload, source.speed], started, api_name="start_file", **settings, **starting
    )
    source.start_url.click(cb.start_url, source.url, started, api_name="start_url", **settings, **starting)
    source.pause.click(cb.pause, None, [cb.live.status, source.pause], api_name="pause", **quick)
    source.stop.click(cb.stop, None, cb.live.status, api_name="stop", **quick)
    source.reset.click(cb.reset, None, started, api_name="reset", **settings, **quick)
    source.speed.change(cb.set_speed, source.speed, None, api_visibility="private", **quick)
    source.webcam.stream(
        cb.webcam_frame,
        source.webcam,
        None,
        stream_every=0.5,
        concurrency_limit=None,
        api_visibility="private",
        **settings,
    )
    # Both ways of asking share one limit (one concurrency_id). The validator runs before a question
    # waits for a slot: one past its viewer's in-flight limit is refused there and takes none.
    asking = {
        "concurrency_limit": ASK_CONCURRENCY,
        "concurrency_id": "ask",
        "show_progress": "minimal",
        "validator": cb.admission.validate,
    }
    asked = [talk.chatbot, talk.question]
    standing = WatchCallbacks(cb)
    talk.ask.click(cb.ask, talk.question, asked, api_name="ask", **asking)
    talk.question.submit(cb.ask, talk.question, asked, api_visibility="private", **asking)
    talk.watch.click(
        standing.watch, talk.watch_question, [talk.watching, talk.watch_question], api_name="watch", **quick
    )
    talk.watch_question.submit(
        standing.watch, talk.watch_question, [talk.watching, talk.watch_question], api_visibility="private", **quick
    )
    talk.unwatch.click(standing.unwatch, talk.watching, talk.watching, api_name="unwatch", **quick)
    inside.refresh.click(cb.metrics, None, inside.metrics, api_name="metrics", **quick)
    gr.api(cb.keepalive, api_name="keepalive", concurrency_limit=None)
    gr.Timer(TICK_S).tick(cb.tick, None, cb.live.components(), api_visibility="private", **quick)
