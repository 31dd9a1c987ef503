"""Reporting the efficiency benchmark: the headline ratios against their targets, the table, JSON and HTML.

The targets are data (`TARGETS`, the one place they are written; docs/design.md lists them): each
headline is one measured value held to one of them, shown as met or missed, never asserted.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from hermes.bench.run import OK, BenchResult, Point, spread
from hermes.engine.methods import FULL, HERMES, as_spec
from hermes.memory.config import HermesConfig


@dataclass(frozen=True)
class Target:
    """A bound a headline value is held to: `op` is "<=", ">=" or "identical" (every value equal)."""

    op: str
    bound: float | None = None
    note: str = ""  # what the bound assumes

    def met(self, value: float | list) -> bool:
        if self.op == "identical":
            return len(set(value)) == 1
        return {"<=": value <= self.bound, ">=": value >= self.bound, ">": value > self.bound}[self.op]

    def __str__(self) -> str:
        text = self.op if self.bound is None else f"{self.op} {self.bound:g}"
        return f"{text} ({self.note})" if self.note else text


TARGETS: dict[str, Target] = {
    "ttft_flat": Target("<=", 1.05),
    "ttft_flat_past_budget": Target("<=", 1.05, "flat once the budget is full"),
    "full_over_hermes": Target(">=", 10.0, "at 512 frames"),
    "cache_constant": Target("identical"),
    "compress_over_prefill": Target("<=", 0.05),
    "guidance_over_prefill": Target("<=", 0.05, "the paper's cheap compression, per compressing chunk"),
    # Frames per second of wall time that prefill plus compression keep up with, by device type.
    "ingest_cpu": Target(">=", 1.0, "the 0.5B shapes on a 2-core CPU, 16-frame chunks"),
    "ingest_cuda": Target(">=", 30.0, "the 7B shapes on one GPU, 16-frame chunks"),
    # The rivals beside HERMES: a budgeted rival answers about as fast; an input filter earns its keep.
    "rival_ttft": Target("<=", 1.2, "a budgeted policy's TTFT over HERMES's, at 512 frames"),
    "dtd_dropped": Target(">=", 0.5, "the share of tokens +dtd drops on a static clip"),
    "dtd_ingest": Target(">", 1.0, "ingest frames/s with +dtd over without"),
}
# The frame count at which the full cache is held to its target.
FULL_TARGET_FRAMES = 512


@dataclass(frozen=True)
class Headline:
    """One headline value of a run, and the target it is held to."""

    name: str
    value: float | list
    text: str
    target: str  # a key of TARGETS
    comparable: bool = True  # False: shown for scale, not held to the target (full at another count)

    @property
    def met(self) -> bool | None:
        return TARGETS[self.target].met(self.value) if self.comparable else None

    def to_dict(self) -> dict:
        return {**asdict(self), "target": str(TARGETS[self.target]), "met": self.met}


def _median(point: Point | None, key: str = "ttft_ms") -> float | None:
    if point is None or point.status != OK:
        return None
    return spread(getattr(point, key))["median"]


def _ttft_ratio(result: BenchResult, hi: int, lo: int, target: str, past: str = "") -> Headline | None:
    a, b = _median(result.point(HERMES, hi)), _median(result.point(HERMES, lo))
    if a is None or b is None:
        return None
    return Headline(
        f"hermes TTFT at {hi} frames / at {lo} frames{past}", a / b, f"{a:.2f} ms / {b:.2f} ms = {a / b:.3f}", target
    )


def headlines(result: BenchResult) -> list[Headline]:
    """The efficiency targets as measured in this run: hermes TTFT flat in the frames streamed,
    full over hermes TTFT, a constant cache past the budget, the compression cost per chunk
    against the prefill's, and ingest frames/s."""
    meta, frames = result.meta, sorted({p.frames for p in result.points})
    lo, hi = frames[0], frames[-1]
    past = [f for f in frames if f * meta["tokens_per_frame"] > meta["budget"]]
    out = [
        _ttft_ratio(result, hi, lo, "ttft_flat") if len(frames) > 1 else None,
        _ttft_ratio(result, hi, past[0], "ttft_flat_past_budget", " (both past the budget)")
        if len(past) > 1 and past[0] != lo
        else None,
    ]
    reached = [f for f in frames if _median(result.point(FULL, f)) is not None]
    # The largest count full reached, and the target's count when that is a different one.
    for at in sorted({reached[-1], FULL_TARGET_FRAMES} & set(reached)) if reached else []:
        full, hermes = _median(result.point(FULL, at)), _median(result.point(HERMES, at))
        if hermes is not None:
            largest = " (the largest count full reached)" if at == reached[-1] else ""
            text = f"{full:.2f} ms / {hermes:.2f} ms = {full / hermes:.1f}x"
            out.append(
                Headline(
                    f"full / hermes TTFT at {at} frames{largest}",
                    full / hermes,
                    text,
                    "full_over_hermes",
                    at == FULL_TARGET_FRAMES,
                )
            )
    sizes = {p.frames: p.cache_bytes for f in past if (p := result.point(HERMES, f)) and p.cache_bytes is not None}
    if sizes:
        name = f"hermes cache bytes past the budget ({', '.join(map(str, sizes))} frames)"
        out.append(
            Headline(name, sorted(set(sizes.values())), ", ".join(f"{v:,}" for v in sizes.values()), "cache_constant")
        )
    out += [_compression(result), _guidance(result), _ingest(result), *_rivals(result)]
    return [h for h in out if h is not None]


def _rivals(result: BenchResult) -> list[Headline]:
    """Each rival whose device cache stays a fixed size (the budget; simplestream's last frames): its
    TTFT over HERMES's at 512 frames; for each X+dtd, the share of tokens dropped (held to its target
    on a static clip only) and its ingest frames/s over X's."""
    out = []
    hermes = _median(result.point(HERMES, FULL_TARGET_FRAMES))
    for policy in dict.fromkeys(as_spec(p.policy) for p in result.points):
        base = policy.base
        if policy.build(HermesConfig()).fixed_size and base.name != HERMES and hermes:
            ttft = _median(result.point(policy.name, FULL_TARGET_FRAMES))
            if ttft is not None:
                name = f"{policy} TTFT / hermes TTFT at {FULL_TARGET_FRAMES} frames"
                out.append(
                    Headline(
                        name, ttft / hermes, f"{ttft:.2f} ms / {hermes:.2f} ms = {ttft / hermes:.2f}x", "rival_ttft"
                    )
                )
        if policy.filters:
            points = [p for p in result.points if p.policy == policy.name and p.status == OK]
            encoded = sum(sum(p.tokens) + sum(p.dropped) for p in points)
            if encoded:
                share = sum(sum(p.dropped) for p in points) / encoded
                static = bool(result.meta.get("static_frames"))
                clip = "a static clip" if static else "random frames, not held to the target"
                out.append(Headline(f"{policy} tokens dropped ({clip})", share, f"{share:.0%}", "dtd_dropped", static))
            with_dtd, without = _ingest_fps(result, policy.name), _ingest_fps(result, base.name)
            if with_dtd and without:
                text = f"{with_dtd:.2f} / {without:.2f} frames/s = {with_dtd / without:.2f}x"
                out.append(Headline(f"{policy} ingest frames/s / {base}'s", with_dtd / without, text, "dtd_ingest"))
    return out


def _ingest_fps(result: BenchResult, policy: str) -> float | None:
    """Frames over prefill and compression seconds, over every measured point of `policy` (the
    chunks that ran as a stream runs them: `Point.as_streamed`)."""
    streamed = [p.as_streamed() for p in result.points if p.policy == policy and p.status == OK]
    seconds = sum(s for _, s in streamed)
    return sum(f for f, _ in streamed) / seconds if streamed and seconds > 0 else None


@dataclass(frozen=True)
class Compressing:
    """HERMES's compressing chunks, medians in ms: those run as a stream runs them, and the
    comparison chunks that ran the guidance pass on its own (none where the prompt cannot ride)."""

    prefill: float
    compress: float
    guidance: float  # the guidance phase of the compression: about 0 where the prompt rode
    count: int
    alone_prefill: float | None = None
    alone_guidance: float | None = None
    alone_count: int = 0

    @property
    def guidance_cost(self) -> float:
        """What the guidance costs a compressing chunk: the riding prompt's share of the prefill
        (the two prefills' difference), or the pass of its own where there is no comparison."""
        if self.alone_prefill is None:
            return self.guidance
        return self.prefill - self.alone_prefill + self.guidance

    @property
    def base_prefill(self) -> float:
        """The chunk's prefill without the guidance in it."""
        return self.prefill if self.alone_prefill is None else self.alone_prefill


def compressing(result: BenchResult) -> Compressing | None:
    """The medians of HERMES's compressing chunks; None before the budget filled (nothing to do)."""
    rows = [
        (sep, p, c, g)
        for point in result.points
        if point.policy == HERMES and point.status == OK
        for sep, p, c, g, e in zip(
            point.separate or [False] * len(point.evicted),
            point.prefill_ms,
            point.compress_ms,
            point.guidance_ms,
            point.evicted,
            strict=True,
        )
        if e > 0
    ]
    streamed = [r[1:] for r in rows if not r[0]]
    alone = [r[1:] for r in rows if r[0]]
    if not streamed:
        return None
    prefill, compress, guidance = (statistics.median(column) for column in zip(*streamed, strict=True))
    if not alone:
        return Compressing(prefill, compress, guidance, len(streamed))
    alone_prefill, _, alone_guidance = (statistics.median(column) for column in zip(*alone, strict=True))
    return Compressing(prefill, compress, guidance, len(streamed), alone_prefill, alone_guidance, len(alone))


def _compression(result: BenchResult) -> Headline | None:
    """The steady state: the chunks that did compress (before the budget fills there is nothing to do)."""
    steady = compressing(result)
    if steady is None:
        return None
    compress, prefill = steady.compress - steady.guidance + steady.guidance_cost, steady.base_prefill
    return Headline(
        f"hermes compression ms / prefill ms per chunk (median of {steady.count} compressing chunks)",
        compress / prefill,
        f"{compress:.1f} ms / {prefill:.1f} ms = {compress / prefill:.3f} "
        f"(the guidance: {steady.guidance_cost:.1f} ms; scoring, eviction and re-indexing: the rest)",
        "compress_over_prefill",
    )


def _guidance(result: BenchResult) -> Headline | None:
    """What the guidance costs against the prefill, over the chunks that compressed: the riding
    prompt's share, measured against the comparison chunks, where it rides."""
    steady = compressing(result)
    if steady is None:
        return None
    cost, prefill = steady.guidance_cost, steady.base_prefill
    if steady.alone_prefill is None:
        text = f"the guidance pass {cost:.1f} ms / {prefill:.1f} ms = {cost / prefill:.3f}"
        name = f"hermes guidance pass ms / prefill ms per chunk (median of {steady.count} compressing chunks)"
    else:
        text = (
            f"the prompt riding on the prefill: {steady.prefill:.1f} ms against {prefill:.1f} ms without it = "
            f"{cost:+.1f} ms, {cost / prefill:.3f}; the pass on its own took {steady.alone_guidance:.1f} ms "
            f"= {steady.alone_guidance / prefill:.3f}"
        )
        name = (
            f"hermes guidance ms / prefill ms per chunk (medians of {steady.count} compressing chunks with the "
            f"prompt riding and {steady.alone_count} with its own pass, alternating)"
        )
    return Headline(name, cost / prefill, text, "guidance_over_prefill")


@dataclass(frozen=True)
class TimeSplit:
    """Where a hermes chunk's time goes (medians per chunk), and the share of the machine it uses."""

    vision_ms: float
    prefill_ms: float  # vision included
    guidance_ms: float  # over the compressing chunks (`Compressing.guidance_cost`)
    rest_ms: float  # the rest of the compression: scoring, eviction, re-indexing
    vision_gflops: float  # FLOP/s reached, in billions
    lm_gflops: float
    prefill_gflops: float
    peak_gflops: float  # this machine's GEMM peak in the model's dtype
    peak_dtype: str

    @property
    def peak_share(self) -> float:
        return self.prefill_gflops / self.peak_gflops

    def text(self) -> str:
        lm_ms = self.prefill_ms - self.vision_ms
        return (
            f"vision encoder {self.vision_ms:.0f} ms, language model {lm_ms:.0f} ms "
            f"(prefill {self.prefill_ms:.0f} ms); "
            f"guidance {self.guidance_ms:.0f} ms, rest of the compression {self.rest_ms:.0f} ms. Reached: vision "
            f"{self.vision_gflops:.0f}, language model {self.lm_gflops:.0f}, prefill {self.prefill_gflops:.0f} "
            f"GFLOP/s = {self.peak_share:.0%} of this machine's {self.peak_dtype} GEMM peak "
            f"({self.peak_gflops:.0f} GFLOP/s)"
        )


def time_split(result: BenchResult) -> TimeSplit | None:
    """The hermes chunks' time split and FLOP rates, when the run measured them."""
    meta = result.meta
    points = [p for p in result.points if p.policy == HERMES and p.status == OK and p.vision_ms]
    flops, peaks = meta.get("chunk_flops"), meta.get("gemm_peak_gflops")
    if not points or not flops or not peaks:
        return None
    chunks = [
        (v, f)
        for p in points
        for v, f, s in zip(p.vision_ms, p.prefill_ms, p.separate or [False] * len(p.prefill_ms), strict=True)
        if not s
    ]
    vision, prefill = (statistics.median(column) for column in zip(*chunks, strict=True))
    steady = compressing(result)
    guidance, compress = (steady.guidance_cost, steady.compress - steady.guidance) if steady else (0.0, 0.0)
    dtype = "bf16" if meta["dtype"] == "bfloat16" else "fp32"
    lm_flops = flops["language_model"]
    return TimeSplit(
        vision,
        prefill,
        guidance,
        compress,
        flops["vision"] / vision / 1e6 if vision else 0.0,
        lm_flops / (prefill - vision) / 1e6 if prefill > vision else 0.0,
        (flops["vision"] + lm_flops) / prefill / 1e6,
        peaks[dtype],
        dtype,
    )


def _ingest(result: BenchResult) -> Headline | None:
    meta = result.meta
    target = f"ingest_{meta.get('device_type')}"
    fps = _ingest_fps(result, HERMES)
    if fps is None or target not in TARGETS:
        return None
    name = f"hermes ingest frames/s (prefill + compression, chunks of {meta['chunk_frames']} frames)"
    return Headline(name, fps, f"{fps:.2f} frames/s", target)


def headline(result: BenchResult) -> list[dict]:
    """The headlines as plain data (name, value, text, target, met), for JSON and tests."""
    return [h.to_dict() for h in headlines(result)]


def result_dict(result: BenchResult) -> dict:
    """Everything a run measured, with its headlines, as plain data."""
    return {"meta": result.meta, "points": [p.summary() for p in result.points], "headline": headline(result)}


def _memory_label(meta: dict) -> str:
    return meta["memory_kind"].split(" (")[0]


def _ms(stats: dict) -> str:
    if stats["median"] is None:
        return "-"
    return f"{stats['median']:.1f} ({stats['min']:.1f}-{stats['max']:.1f})"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.2f}"


def _layers_label(meta: dict) -> str:
    """'24 layers', or for a hybrid model how many keep keys and values and how many a state."""
    kv = meta.get("kv_layers", meta["layers"])
    if kv == meta["layers"]:
        return f"{meta['layers']} layers"
    states, state_mib = meta["layers"] - kv, _mib(meta["state_bytes"])
    return f"{meta['layers']} layers: {kv} with keys and values, {states} with states ({state_mib} MiB in all)"


def render_markdown(result: BenchResult) -> str:
    """The table and the headline ratios, as Markdown."""
    meta = result.meta
    weights = ", random weights" if meta["random_weights"] else ""
    lines = [
        f"Model: {meta['model']} ({meta['architecture']}, {_layers_label(meta)}, {meta['dtype']}{weights}); "
        f"device: {meta['device']}.",
        f"Budget {meta['budget']} tokens per layer, chunks of {meta['chunk_frames']} frames, "
        f"{meta['frame_size']} px frames = {meta['tokens_per_frame']:g} tokens per frame, "
        f"{meta['repeats']} x {len(meta['questions'])} questions per point, {meta['max_new_tokens']} new tokens.",
        "",
        "| policy | frames | TTFT ms median (min-max) | TPOT ms median (min-max) | prefill ms/chunk "
        f"| compress ms/chunk | ingest frames/s | cache MiB | {_memory_label(meta)} MiB | status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in result.points:
        s = p.summary()
        prefill = s["prefill_ms_stats"]["median"]
        compress = s["compress_ms_stats"]["median"]
        status = p.status if not p.note else f"{p.status}: {p.note}"
        lines.append(
            f"| {p.policy} | {p.frames} | {_ms(s['ttft_ms_stats'])} | {_ms(s['tpot_ms_stats'])} "
            f"| {'-' if prefill is None else f'{prefill:.0f}'} | {'-' if compress is None else f'{compress:.0f}'} "
            f"| {'-' if p.ingest_fps is None else f'{p.ingest_fps:.2f}'} "
            f"| {_mib(p.cache_bytes)} | {_mib(p.memory_bytes)} | {status} |"
        )
    lines += rivals_table(result)
    lines += retrieval_table(result)
    split = time_split(result)
    if split is not None:
        peaks, flops = meta["gemm_peak_gflops"], meta["chunk_flops"]
        lines += [
            "",
            f"Where a hermes chunk's time goes (medians per chunk): {split.text()}. GEMM peak measured now: "
            f"bf16 {peaks['bf16']:.0f}, fp32 {peaks['fp32']:.0f} GFLOP/s; FLOPs per chunk: vision "
            f"{flops['vision'] / 1e9:.0f} G, language model {flops['language_model'] / 1e9:.0f} G.",
        ]
    lines += ["", "Headline ratios (this run; targets shown, not asserted):"]
    for h in headline(result):
        verdict = {True: "met", False: "missed", None: "not comparable"}[h["met"]]
        lines.append(f"- {h['name']}: {h['text']} (target {h['target']}: {verdict})")
    return "\n".join(lines)


def render_comparison(results: list[BenchResult]) -> str:
    """Several models of one run side by side, as Markdown: ingest speed and what the memory holds."""
    lines = [
        "| model | layers | tokens/frame | hermes ingest frames/s | guidance / prefill | vision / prefill "
        "| prefill share of the GEMM peak | hermes cache MiB (states) | kv bytes/token |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        meta = result.meta
        ingest, guidance, split = _ingest(result), _guidance(result), time_split(result)
        hermes = [p for p in result.points if p.policy == HERMES and p.cache_bytes is not None]
        cache = _mib(hermes[-1].cache_bytes) if hermes else "-"
        shares = ("-", "-")
        if split is not None:
            shares = (f"{split.vision_ms / split.prefill_ms:.0%}", f"{split.peak_share:.0%} of {split.peak_dtype}")
        lines.append(
            f"| {meta['model']} | {_layers_label(meta)} | {meta['tokens_per_frame']:g} | {_verdict(ingest, '.2f')} "
            f"| {_verdict(guidance, '.1%')} | {shares[0]} | {shares[1]} | {cache} ({_mib(meta.get('state_bytes', 0))}) "
            f"| {meta['kv_bytes_per_token']:,} |"
        )
    return "\n".join(lines)


def _verdict(headline: Headline | None, spec: str) -> str:
    """A headline's value with met or missed, for a table cell."""
    if headline is None:
        return "-"
    return f"{headline.value:{spec}} ({'met' if headline.met else 'missed'})"


def write_html(result: BenchResult, path: str | Path) -> Path:
    """A self-contained Plotly page: TTFT and memory against frames, one line per policy."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    meta = result.meta
    memory = _memory_label(meta)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT (median, min-max)", f"{memory} memory"))
    for policy in dict.fromkeys(p.policy for p in result.points):
        ok = [p for p in result.points if p.policy == policy and p.status == OK]
        stats = [spread(p.ttft_ms) for p in ok]
        x = [p.frames for p in ok]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[s["median"] for s in stats],
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [s["max"] - s["median"] for s in stats],
                    "arrayminus": [s["median"] - s["min"] for s in stats],
                },
                mode="lines+markers",
                name=policy,
                legendgroup=policy,
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[p.memory_bytes / 2**30 for p in ok],
                mode="lines+markers",
                name=policy,
                legendgroup=policy,
                showlegend=False,
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(type="log", title_text="frames streamed")
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="GiB", row=1, col=2)
    weights = ", random weights" if meta["random_weights"] else ""
    fig.update_layout(title=f"HERMES efficiency: {meta['model']}{weights} on {meta['device']}", template="plotly_white")
    path = Path(path)
    fig.write_html(path, include_plotlyjs=True)  # inline: the page works offline
    return path


def write_json(result: BenchResult, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(result_dict(result), indent=2))
    return path


def _ratio(value: float | None, base: float | None, digits: int = 2) -> str:
    if value is None or base is None or base == 0:
        return "-"
    return f"{value / base:.{digits}f}x"


def rivals_table(result: BenchResult) -> list[str]:
    """Every policy against HERMES at each frame count, from the same run: TTFT, device memory,
    cache, ingest frames/s, compression per chunk and the tokens an input filter dropped. Empty
    unless the run has HERMES and another policy."""
    policies = list(dict.fromkeys(p.policy for p in result.points))
    if HERMES not in policies or len(policies) < 2:
        return []
    label = _memory_label(result.meta)
    lines = [
        "",
        "Against HERMES in this run (ratios: the policy's value / HERMES's at the same frame count):",
        "",
        f"| policy | frames | TTFT ms | TTFT x | {label} MiB | {label} x | cache MiB | cache x | ingest frames/s "
        "| ingest x | compress ms/chunk (/ prefill) | tokens dropped |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in result.points:
        h = result.point(HERMES, p.frames)
        if p.status != OK:
            lines.append(f"| {p.policy} | {p.frames} | {p.status} | | | | | | | | | |")
            continue
        ok = h is not None and h.status == OK
        ttft, base = _median(p), _median(h) if ok else None
        compress, prefill = _median(p, "compress_ms"), _median(p, "prefill_ms")
        share = "-" if compress is None or not prefill else f"{compress:.0f} ({compress / prefill:.3f})"
        encoded = sum(p.tokens) + sum(p.dropped)
        dropped = f"{sum(p.dropped):,} ({sum(p.dropped) / encoded:.0%})" if encoded else "-"
        lines.append(
            f"| {p.policy} | {p.frames} | {'-' if ttft is None else f'{ttft:.1f}'} | {_ratio(ttft, base)} "
            f"| {_mib(p.memory_bytes)} | {_ratio(p.memory_bytes, h.memory_bytes if ok else None)} "
            f"| {_mib(p.cache_bytes)} | {_ratio(p.cache_bytes, h.cache_bytes if ok else None)} "
            f"| {'-' if p.ingest_fps is None else f'{p.ingest_fps:.2f}'} "
            f"| {_ratio(p.ingest_fps, h.ingest_fps if ok else None)} | {share} | {dropped} |"
        )
    return lines


def retrieval_table(result: BenchResult) -> list[str]:
    """Each retrieval policy (rekv) against HERMES at each frame count, from the same run: TTFT and
    its retrieval part, the device cache at its peak (window plus frames brought back), host memory,
    and ratios. Empty unless the run has HERMES and a retrieval policy."""
    retrieving = list(dict.fromkeys(p.policy for p in result.points if p.host_bytes is not None))
    if not retrieving or not any(p.policy == HERMES for p in result.points):
        return []
    lines = [
        "",
        "Retrieval against HERMES (device: the cache at its peak, with the frames brought back; host: the store "
        "of every frame; ratios: the policy's value / HERMES's at the same frame count):",
        "",
        "| policy | frames | TTFT ms | of which retrieval ms | TTFT x | device MiB | device x | host MiB "
        "| device + host x |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in result.points:
        if p.policy not in (HERMES, *retrieving):
            continue
        if p.status != OK:
            lines.append(f"| {p.policy} | {p.frames} | {p.status}: {p.note} | | | | | | |")
            continue
        h = result.point(HERMES, p.frames)
        ok = h is not None and h.status == OK
        ttft, base, fetch = _median(p), _median(h) if ok else None, _median(p, "retrieval_ms")
        total = (p.device_bytes or 0) + (p.host_bytes or 0)
        lines.append(
            f"| {p.policy} | {p.frames} | {'-' if ttft is None else f'{ttft:.1f}'} "
            f"| {'-' if fetch is None else f'{fetch:.1f}'} | {_ratio(ttft, base)} | {_mib(p.device_bytes)} "
            f"| {_ratio(p.device_bytes, h.device_bytes if ok else None)} | {_mib(p.host_bytes or 0)} "
            f"| {_ratio(total, h.device_bytes if ok else None)} |"
        )
    return lines
