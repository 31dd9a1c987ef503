"""Benchmark-file evaluation: the annotation readers, each benchmark's prompts and rules, and the harness."""

from hermes.eval.formats import BENCHES
from hermes.eval.harness import EvalSettings, run_eval
from hermes.eval.items import AnnotationError, Item, Problem
from hermes.eval.summary import summarize

__all__ = ["BENCHES", "AnnotationError", "EvalSettings", "Item", "Problem", "run_eval", "summarize"]
