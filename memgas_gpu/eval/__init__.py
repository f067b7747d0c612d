"""Retrieval metrics, evaluation and LongMemEval-style logs."""
from .metrics import KS, gold_mask, metric_names, retrieval_metrics
from .runner import Evaluation, evaluate, format_table, write_logs
from .turns import TURN_KS, evaluate_turns, session_turn_rankings, turn_metrics

__all__ = ["KS", "gold_mask", "metric_names", "retrieval_metrics", "Evaluation", "evaluate",
           "format_table", "write_logs", "TURN_KS", "evaluate_turns", "session_turn_rankings",
           "turn_metrics"]
