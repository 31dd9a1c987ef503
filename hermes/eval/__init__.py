"""Benchmark-file evaluation: annotation readers (formats) and the streaming harness."""

from hermes.eval.formats import BENCHES, AnnotationError, Item, Problem
from hermes.eval.harness import EvalSettings, run_eval, summarize

__all__ = ["BENCHES", "AnnotationError", "EvalSettings", "Item", "Problem", "run_eval", "summarize"]
