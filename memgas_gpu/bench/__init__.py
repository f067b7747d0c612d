"""Benchmark suite: stage timers, scaling sweeps, ours vs the reference way, and a report.

``memgas bench --out DIR`` runs :func:`run_suite` and :func:`write_report`; the
pytest-benchmark files in ``benchmarks/`` call the same stage functions.
"""
from .limits import GOALS, PEAK_BYTES, PEAK_FLOPS, RATIO_GOALS, evaluate_goals, limit_seconds
from .report import goal_table, ratios, write_json, write_markdown, write_plots, write_report
from .scaling import EXPECTED, fit_slope, scaling_rows
from .stages import bm25_point, graph_point, query_point
from .stages_io import encode_point, fixed64_encode, index_point, io_point, make_encoder
from .suite import SCALES, STAGES, SuiteResult, SuiteScale, machine_info, run_suite, scale_with
from .timing import Deadline, PeakMemory, Record, measure, percentile

__all__ = [
    "GOALS", "PEAK_BYTES", "PEAK_FLOPS", "RATIO_GOALS", "evaluate_goals", "limit_seconds",
    "goal_table", "ratios", "write_json", "write_markdown", "write_plots", "write_report",
    "EXPECTED", "fit_slope", "scaling_rows",
    "bm25_point", "graph_point", "query_point",
    "encode_point", "fixed64_encode", "index_point", "io_point", "make_encoder",
    "SCALES", "STAGES", "SuiteResult", "SuiteScale", "machine_info", "run_suite", "scale_with",
    "Deadline", "PeakMemory", "Record", "measure", "percentile",
]
