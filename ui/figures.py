"""Plotly figures of a live stream, built from the plain data the worker publishes.

Every figure is sent whole to the browser when it changes, so each is downsampled to a small,
fixed size: at most MAX_FRAME_COLUMNS frame bins in the retained-token map, MAX_SLOT_POINTS slot
bins per attention profile, MAX_HISTORY_POINTS points per line.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hermes.serving import (
    ATTENTION,
    BUDGET,
    HOST,
    AttentionLayers,
    ChunkRecord,
    FrameTokens,
    LayerSnapshot,
    LiveView,
    MemorySnapshot,
    PolicySpec,
    Tier,
    WatchCheck,
)

MAX_FRAME_COLUMNS = 64
MAX_SLOT_POINTS = 160
MAX_HISTORY_POINTS = 300
MB = 1024 * 1024

# One colour per standing question (at most four), in the order they were added.
WATCH_COLORS = ("#db2777", "#0891b2", "#65a30d", "#9333ea")
TIER_COLORS = {Tier.SENSORY: "#0ea5e9", Tier.WORKING: "#8b5cf6", Tier.LONG_TERM: "#be123c"}
FONT = {"family": "Inter, ui-sans-serif, system-ui, sans-serif", "size": 12, "color": "#1f2937"}
GRID = "#e5e7eb"


def _layout(fig: go.Figure, height: int) -> go.Figure:
    # A tiny hand-made style instead of a plotly template: templates add kilobytes to every update.
    fig.update_layout(
        template="none",
        height=height,
        margin={"l": 64, "r": 24, "t": 40, "b": 48},
        font=FONT,
        paper_bgcolor="white",
        plot_bgcolor="white",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        hoverlabel={"font": {"size": 12}},
    )
    fig.update_xaxes(gridcolor=GRID, zeroline=False, linecolor="#9ca3af")
    fig.update_yaxes(gridcolor=GRID, zeroline=False, linecolor="#9ca3af")
    return fig


def placeholder(text: str, height: int = 320) -> go.Figure:
    """An empty figure that says what will appear once the stream runs."""
    fig = go.Figure()
    fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 14})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, height)


def _bins(n: int, most: int) -> np.ndarray:
    """Edges that split range(n) into at most `most` contiguous, near-equal bins."""
    return np.unique(np.linspace(0, n, min(n, most) + 1).round().astype(int))


# -- retained-token map ------------------------------------------------------------------------


def retained_shares(
    snapshot: MemorySnapshot, frame_tokens: FrameTokens, max_columns: int = MAX_FRAME_COLUMNS
) -> tuple[np.ndarray, np.ndarray]:
    """(shares (layers, bins), bin edges in frames): the share of each frame bin's tokens that
    each layer still keeps, out of the tokens the frames had when prefilled (`frame_tokens`)."""
    n_frames = len(frame_tokens)
    edges = _bins(n_frames, max_columns)
    denom = frame_tokens.sums(edges)
    rows = []
    for layer in snapshot.layers:
        frames = layer.frames[(layer.frames >= 0) & (layer.frames < n_frames)]
        # Counted by bin, not by frame: nothing here grows with the length of the stream.
        bins = np.searchsorted(edges, frames, side="right") - 1
        rows.append(np.bincount(bins, minlength=len(edges) - 1).astype(float) if n_frames else np.zeros(0))
    shares = np.clip(np.asarray(rows) / np.maximum(denom, 1e-9), 0.0, 1.0) if rows else np.zeros((0, 0))
    return shares, edges


def _tier_spans(layers: list[LayerSnapshot]) -> list[tuple[Tier, int, int]]:
    spans: list[tuple[Tier, int, int]] = []
    for i, layer in enumerate(layers):
        if spans and spans[-1][0] is layer.tier:
            spans[-1] = (layer.tier, spans[-1][1], i)
        else:
            spans.append((layer.tier, i, i))
    return spans


def retained_map_figure(view: LiveView) -> go.Figure:
    """Layers (y) by stream time in frames (x): the share of each frame's tokens each layer keeps."""
    if view.frames_seen == 0 or not view.snapshots:
        return placeholder("Start a stream: each layer's retained tokens appear here, frame by frame.", 360)
    policies = list(view.snapshots)
    fig = make_subplots(
        rows=1,
        cols=len(policies),
        shared_yaxes=True,
        horizontal_spacing=0.04,
        subplot_titles=[f"{p.label} memory" for p in policies] if len(policies) > 1 else None,
    )
    for col, policy in enumerate(policies, start=1):
        snap = view.snapshots[policy]
        fig.add_trace(_retained_heatmap(snap, view, last=col == len(policies)), row=1, col=col)
        _tier_bands(fig, snap, col)
        fig.update_xaxes(title_text="stream time (frame)", row=1, col=col, range=[-0.5, view.frames_seen - 0.5])
        for frame, seconds in view.gaps:  # where the memory saw nothing (a stream that dropped, a skip)
            fig.add_vline(x=frame - 0.5, line={"dash": "dash", "color": "#dc2626", "width": 1}, row=1, col=col)
            fig.add_annotation(
                x=frame - 0.5,
                y=1.0,
                yref="paper",
                text=f"{seconds:.0f} s gap",
                showarrow=False,
                yshift=8,
                font={"size": 10, "color": "#dc2626"},
                row=1,
                col=col,
            )
    first = next(iter(view.snapshots.values()))
    n_layers = len(first.layers)
    # Rows are the layers with keys and values, labelled with their decoder layer number (a hybrid
    # model's attention layers are every fourth one).
    step = max(1, n_layers // 8)
    rows = list(range(0, n_layers, step))
    names = first.layer_names()
    fig.update_yaxes(range=[-0.5, n_layers - 0.5], tickvals=rows, ticktext=[str(names[r]) for r in rows], ticks="")
    # Non-breaking spaces keep the layer numbers clear of the tier band.
    fig.update_yaxes(title_text="layer", title_standoff=24, ticksuffix="\u00a0" * 7, row=1, col=1)
    fig = _layout(fig, 380)
    fig.update_layout(margin={"l": 96, "t": 48})
    if first.state_layers:
        fig.add_annotation(
            text=f"{first.state_layers} more layers are linear attention: each holds a fixed-size state "
            f"({first.state_bytes / 2**20:.1f} MiB in all), not tokens",
            xref="paper",
            yref="paper",
            x=0,
            y=1.0,
            yshift=30,
            xanchor="left",
            showarrow=False,
            font={"size": 11, "color": "#6b7280"},
        )
    return fig


def _retained_heatmap(snap: MemorySnapshot, view: LiveView, last: bool) -> go.Heatmap:
    """One memory's map; the colour scale is drawn beside the `last` one only."""
    shares, edges = retained_shares(snap, view.frame_tokens)
    centers = (edges[:-1] + edges[1:] - 1) / 2.0
    return go.Heatmap(
        z=np.round(shares, 2).tolist(),
        x=centers.tolist(),
        y=list(range(len(snap.layers))),
        zmin=0,
        zmax=1,
        colorscale=[[0, "#f8fafc"], [0.02, "#e0e7ff"], [0.5, "#818cf8"], [1, "#312e81"]],
        colorbar={"title": {"text": "kept", "side": "right"}, "tickformat": ".0%", "len": 0.9, "x": 1.01},
        showscale=last,
        customdata=[[name] * len(centers) for name in snap.layer_names()],
        hovertemplate="layer %{customdata}<br>frames around %{x:.0f}<br>kept %{z:.0%}<extra></extra>",
        xgap=1,
        ygap=1,
    )


def _tier_bands(fig: go.Figure, snap: MemorySnapshot, col: int) -> None:
    """A coloured band just left of map `col` (sized in pixels) for each memory tier, dotted lines
    between the tiers, and the tiers' names left of the first map."""
    for tier, lo, hi in _tier_spans(snap.layers):
        fig.add_shape(
            type="rect",
            xref=f"x{col if col > 1 else ''} domain",
            yref=f"y{col if col > 1 else ''}",
            xsizemode="pixel",
            xanchor=0,
            x0=-14,
            x1=-4,
            y0=lo - 0.5,
            y1=hi + 0.5,
            fillcolor=TIER_COLORS[tier],
            line={"width": 0},
        )
        if lo > 0:
            fig.add_hline(y=lo - 0.5, line={"color": "#111827", "width": 1, "dash": "dot"}, row=1, col=col)
        if col == 1:
            fig.add_annotation(
                text=tier.value,
                x=0,
                xref="x domain",
                xshift=-50,  # left of the band and of the layer numbers
                xanchor="right",
                y=(lo + hi) / 2,
                yref="y",
                showarrow=False,
                font={"color": TIER_COLORS[tier], "size": 11 if hi - lo >= 3 else 9},
                textangle=-90,
            )


# -- attention profile -------------------------------------------------------------------------


def profile_layers(snapshot: MemorySnapshot, attention: AttentionLayers | None = None) -> list[int]:
    """A shallow, a middle and a deep layer among those with an attention record (all, without
    `attention`): the shallowest, the middle of working memory, the deepest. HERMES measures no
    attention in sensory layers, which score by recency alone."""
    measured = [i for i in range(len(snapshot.layers)) if attention is None or attention[i] is not None]
    if not measured:
        return []
    working = [i for i in measured if snapshot.layers[i].tier is Tier.WORKING]
    picks = [measured[0], working[len(working) // 2] if working else measured[len(measured) // 2], measured[-1]]
    return list(dict.fromkeys(picks))


def binned_profile(weights: np.ndarray, most: int = MAX_SLOT_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(bin centres, largest weight per bin): the max keeps the sharp peaks (anchors) visible."""
    edges = _bins(len(weights), most)
    if len(weights) == 0:
        return np.zeros(0), np.zeros(0)
    return (edges[:-1] + edges[1:] - 1) / 2.0, np.maximum.reduceat(weights, edges[:-1])


def attention_figure(view: LiveView) -> go.Figure:
    """Guidance attention over the cached slots, in stream order, for a shallow, middle and deep layer
    of the first policy that measures attention (HERMES's guidance prompt, StreamMem's template)."""
    measuring = [p for p in view.snapshots if ATTENTION in p.plots]
    if not measuring:
        names = " and ".join(p.label for p in view.snapshots) or "These policies"
        return placeholder(f"{names} measure no attention over the memory: no profile to show.", 330)
    policy = next((p for p in measuring if p in view.attention), measuring[0])
    snap, record = view.snapshots[policy], view.attention.get(policy)  # per layer: (stream ids, weights) or None
    layers = profile_layers(snap, record) if record is not None else []
    if not layers:
        return placeholder("The attention profile appears at the first compression (when the memory is full).", 330)
    fig = make_subplots(
        rows=len(layers),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.1,
        subplot_titles=[
            f"{policy.label + ' · ' if len(view.snapshots) > 1 else ''}layer {snap.layer_names()[i]} · "
            f"{snap.layers[i].tier.value}"
            for i in layers
        ],
    )
    for row, i in enumerate(layers, start=1):
        x, y = binned_profile(record[i][1].astype(float))
        color = TIER_COLORS[snap.layers[i].tier]
        fig.add_trace(
            go.Scatter(
                x=x.tolist(),
                y=np.round(y, 5).tolist(),
                mode="lines",
                line={"color": color, "width": 1.5},
                fill="tozeroy",
                name=f"layer {i}",
                hovertemplate="slot %{x:.0f}<br>attention %{y:.4f}<extra></extra>",
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(title_text="weight", row=row, col=1, rangemode="tozero")
    fig.update_xaxes(title_text="cached video slots, oldest → newest", row=len(layers), col=1)
    fig = _layout(fig, 360)
    fig.update_layout(showlegend=False, margin={"t": 36})
    fig.update_annotations(font={"size": 12})
    return fig


# -- TTFT and memory -----------------------------------------------------------------------------


def _thin(records: tuple[ChunkRecord, ...]) -> list[ChunkRecord]:
    step = max(1, -(-len(records) // MAX_HISTORY_POINTS))
    out = list(records[::step])
    if records and out[-1] is not records[-1]:
        out.append(records[-1])
    return out


def performance_figure(view: LiveView, gpu: bool) -> go.Figure:
    """Left: TTFT of each answer against frames seen. Right: memory against frames seen."""
    if not view.history:
        return placeholder("TTFT and memory appear here as the stream runs and you ask questions.", 330)
    second = "GPU allocated" if gpu else "process RSS"
    fig = make_subplots(
        rows=1,
        cols=2,
        specs=[[{}, {"secondary_y": True}]],
        horizontal_spacing=0.16,
        subplot_titles=["Time to first token", "Memory"],
    )
    if not view.answers:
        fig.add_annotation(
            text="Ask a question:<br>its TTFT appears here",
            x=0.5,
            y=0.5,
            xref="x domain",
            yref="y domain",
            showarrow=False,
            font={"color": "#6b7280"},
        )
    records = _thin(view.history)
    for policy in view.snapshots:
        answers = [a for a in view.answers if a.policy == policy]  # finished ones: each has its update
        if answers:  # an empty line trace makes plotly.js draw NaN paths (console errors)
            fig.add_trace(_ttft_line(policy, answers), row=1, col=1)
        for line in _memory_lines(policy, records):
            fig.add_trace(line, row=1, col=2)
    _budget_line(fig, view)
    fig.add_trace(
        go.Scatter(
            x=[r.frames_seen for r in records],
            y=[round(((r.gpu_allocated_bytes if gpu else r.rss_bytes) or 0) / MB, 1) for r in records],
            mode="lines",
            line={"color": "#64748b", "width": 2, "dash": "dot"},
            name=second,
            hovertemplate="%{x} frames<br>%{y:.0f} MB<extra></extra>",
        ),
        row=1,
        col=2,
        secondary_y=True,
    )
    fig.update_xaxes(title_text="frames seen", row=1, col=1, rangemode="tozero")
    fig.update_xaxes(title_text="frames seen", row=1, col=2, rangemode="tozero")
    fig.update_yaxes(title_text="ms", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="cache (and host) MB", row=1, col=2, rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text=f"{second} MB", row=1, col=2, rangemode="tozero", secondary_y=True, showgrid=False)
    fig = _layout(fig, 360)
    fig.update_layout(legend={"y": -0.28, "yanchor": "top"}, margin={"b": 24})
    return fig


def _ttft_line(policy: PolicySpec, answers: list) -> go.Scatter:
    """The TTFT of each of `policy`'s finished answers against the frames seen when it was asked."""
    return go.Scatter(
        x=[a.update.frames_seen for a in answers],
        y=[round(a.update.ttft_ms or 0.0, 1) for a in answers],
        customdata=[[round(a.wait_ms, 1)] for a in answers],
        mode="lines+markers",
        marker={"size": 8, "color": policy.colour},
        line={"color": policy.colour, "width": 1},
        name=f"{policy.label} TTFT",
        hovertemplate="%{x} frames seen<br>TTFT %{y:.0f} ms<br>waited %{customdata[0]:.0f} ms<extra></extra>",
    )


def _memory_lines(policy: PolicySpec, records: list[ChunkRecord]) -> list[go.Scatter]:
    """`policy`'s cache against the frames seen, and its host memory where it keeps one (rekv's
    store of every frame) as a dashed line of its own."""
    lines = [("cache_bytes", "cache", "solid")] + (
        [("host_bytes", "host memory", "dash")] if HOST in policy.plots else []
    )
    return [
        go.Scatter(
            x=[r.frames_seen for r in records],
            y=[round(r.per_policy(number).get(policy, 0) / MB, 3) for r in records],
            mode="lines",
            line={"color": policy.colour, "width": 2, "dash": dash},
            name=f"{policy.label} {what}",
            hovertemplate=f"%{{x}} frames<br>{what.split()[0]} %{{y:.2f}} MB<extra></extra>",
        )
        for number, what, dash in lines
    ]


def _budget_line(fig: go.Figure, view: LiveView) -> None:
    """The budget |M| as a dashed line, at the larger of the caches held at it (HERMES keeps a
    summary slot more than FIFO). Only the policies held at the budget draw it: a full cache has
    none, and ReKV's bound includes the room for the frames a question brings back."""
    budgets = [b for policy, b in view.budget_bytes.items() if BUDGET in policy.plots]
    if budgets:
        fig.add_hline(
            y=max(budgets) / MB,
            line={"color": "#111827", "dash": "dash", "width": 1},
            annotation_text="budget |M|",
            annotation_position="bottom right",
            annotation_font={"size": 10},
            row=1,
            col=2,
        )


# -- standing questions ----------------------------------------------------------------------------


def short(text: str, most: int = 48) -> str:
    """`text` cut to `most` characters, with an ellipsis when cut (legend entries)."""
    return text if len(text) <= most else text[: most - 1] + "…"


def _thin_points(points: list[WatchCheck]) -> list[WatchCheck]:
    step = max(1, -(-len(points) // MAX_HISTORY_POINTS))
    # Keep every firing: thinning must not hide the moments the plot is about.
    return [p for i, p in enumerate(points) if i % step == 0 or p.fired or i == len(points) - 1]


def watch_figure(view: LiveView) -> go.Figure:
    """p(yes) of each standing question after every chunk against stream time, with the threshold
    and a star where it fired (dashed lines: FIFO's memory, in Compare mode)."""
    if not view.watch_history:
        return placeholder("Add a question under 'Watch for': its p(yes) after every chunk appears here.", 300)
    fig = go.Figure()
    questions = list(dict.fromkeys(p.check.question for p in view.watch_history))
    policies = list(dict.fromkeys(p.policy for p in view.watch_history))
    for qi, question in enumerate(questions):
        color = WATCH_COLORS[qi % len(WATCH_COLORS)]
        for policy in policies:
            points = _thin_points(
                [p.check for p in view.watch_history if p.check.question == question and p.policy == policy]
            )
            if not points:
                continue
            name = short(question) + (f" · {policy.label}" if len(policies) > 1 else "")
            dash = "solid" if policy == policies[0] else "dash"
            fig.add_trace(
                go.Scatter(
                    x=[round(p.at_s, 2) for p in points],
                    y=[round(p.p_yes, 4) for p in points],
                    customdata=[[round(p.check_ms, 1)] for p in points],
                    mode="lines+markers" if len(points) > 1 else "markers",
                    line={"color": color, "width": 2, "dash": dash},
                    marker={"size": 4, "color": color},
                    name=name,
                    legendgroup=name,
                    hovertemplate="%{x:.1f} s<br>p(yes) %{y:.2f}<br>check %{customdata[0]:.0f} ms<extra></extra>",
                )
            )
            fired = [p for p in points if p.fired]
            if fired:
                fig.add_trace(
                    go.Scatter(
                        x=[round(p.at_s, 2) for p in fired],
                        y=[round(p.p_yes, 4) for p in fired],
                        mode="markers",
                        marker={"symbol": "star", "size": 14, "color": color, "line": {"color": "#111827", "width": 1}},
                        name=f"{name}: alert",
                        legendgroup=name,
                        showlegend=False,
                        hovertemplate="alert at %{x:.1f} s<br>p(yes) %{y:.2f}<extra></extra>",
                    )
                )
    fig.add_hline(
        y=view.settings.watch_threshold,
        line={"color": "#111827", "dash": "dash", "width": 1},
        annotation_text=f"threshold {view.settings.watch_threshold:g}",
        annotation_position="top left",
        annotation_font={"size": 10},
    )
    fig.update_xaxes(title_text="stream time (s)", rangemode="tozero")
    fig.update_yaxes(title_text="p(yes)", range=[-0.02, 1.02])
    fig = _layout(fig, 300)
    fig.update_layout(legend={"y": -0.3, "yanchor": "top"}, margin={"t": 24, "b": 24})
    return fig
