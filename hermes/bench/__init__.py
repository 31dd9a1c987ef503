"""Efficiency benchmark: the paper's Table 3 and Figure 4, reproduced for any model.

`run` streams each policy and measures it (TTFT, TPOT, prefill and compression per chunk, cache
bytes, peak memory) at each requested frame count; `report` holds the headline ratios against
their targets and writes the table, JSON and a Plotly page.
"""

from hermes.bench.report import (
    TARGETS,
    headline,
    render_comparison,
    render_markdown,
    result_dict,
    write_html,
    write_json,
)
from hermes.bench.run import (
    CPU_FULL_MAX_FRAMES,
    DEFAULT_BENCH_MODEL,
    DEFAULT_FRAMES,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_POLICIES,
    DEFAULT_REPEATS,
    QUESTIONS,
    BenchResult,
    BenchSettings,
    Point,
    device_label,
    load_bench_model,
    prefill_bytes,
    run_bench,
    synthetic_chunk,
)

__all__ = [
    "CPU_FULL_MAX_FRAMES",
    "DEFAULT_BENCH_MODEL",
    "DEFAULT_FRAMES",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_POLICIES",
    "DEFAULT_REPEATS",
    "QUESTIONS",
    "TARGETS",
    "BenchResult",
    "BenchSettings",
    "Point",
    "device_label",
    "headline",
    "load_bench_model",
    "prefill_bytes",
    "render_comparison",
    "render_markdown",
    "result_dict",
    "run_bench",
    "synthetic_chunk",
    "write_html",
    "write_json",
]
