"""GAM's settings and the names the command line offers (no tensor code: importing this
module imports neither torch nor numpy).

* :class:`GamParams`: every setting, checked when made (a wrong type, a NaN or an
  out-of-range value is refused with one line naming the field).
* :data:`SEGMENTATIONS` and :func:`parse_segmentation`: the topic segmentations.
* :data:`FLAT_METHODS`: flat utterance baselines over the same events and signals.
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, fields, replace
from typing import Any

__all__ = ["GamParams", "SEGMENTATIONS", "parse_segmentation", "FLAT_METHODS"]

#: segmentation strategies: semantic boundaries (GAM), fixed token windows, fixed
#: utterance counts, sessions, and one topic per utterance (no buffering)
SEGMENTATIONS = ("semantic", "tokens256", "tokens512", "turns3", "turns5", "session", "event")
#: flat utterance retrieval over the same events and signals (no topics)
FLAT_METHODS = ("flat_dense", "flat_bm25", "flat_fusion")
_SPEC = re.compile(r"^(semantic|session|event|tokens(\d{1,9})|turns(\d{1,9}))$")


def parse_segmentation(spec: Any) -> tuple[str, int]:
    """``"tokens256"`` → ``("tokens", 256)``, ``"semantic"`` → ``("semantic", 0)``."""
    m = _SPEC.match(spec) if isinstance(spec, str) else None
    if not m or (m.group(2) is not None and int(m.group(2)) < 1) or \
            (m.group(3) is not None and int(m.group(3)) < 1):
        raise ValueError(f"unknown segmentation {spec!r}: use semantic, session, event, "
                         "tokens<N> or turns<N> (e.g. tokens256, turns3)")
    if m.group(2):
        return "tokens", int(m.group(2))
    if m.group(3):
        return "turns", int(m.group(3))
    return m.group(1), 0


# field -> (kind, low, high); kind "int" / "real" (finite) / "bool"; None = unbounded;
# a real low bound in a 1-tuple is exclusive
_CHECKS = {
    "window": ("int", 1, None), "theta": ("real", None, None), "min_events": ("int", 0, None),
    "max_tokens": ("int", 1, None), "noise": ("real", 0.0, 1.0), "noise_seed": ("int", 0, None),
    "epg_window": ("int", 1, None), "tan_m": ("int", 1, None),
    "tan_candidates": ("int", 0, None), "conf_min": ("real", 0.0, 1.0),
    "min_earlier": ("int", 0, None), "alpha": ("real", None, None),
    "anchors": ("int", 0, None), "gamma": ("real", None, None), "eta": ("real", None, None),
    "beta_time": ("real", (0.0,), None), "beta_role": ("real", (0.0,), None),
    "beta_conf": ("real", (0.0,), None), "tan": ("bool", None, None),
    "epg": ("bool", None, None), "mfr": ("bool", None, None),
}


def _check(name: str, value: Any) -> None:
    kind, lo, hi = _CHECKS[name]
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"GamParams.{name} must be True or False, got {value!r}")
        return
    if isinstance(value, bool) or not isinstance(
            value, numbers.Integral if kind == "int" else numbers.Real):
        what = "an integer" if kind == "int" else "a number"
        raise ValueError(f"GamParams.{name} must be {what}, got {value!r}")
    if kind == "real" and not math.isfinite(float(value)):
        raise ValueError(f"GamParams.{name} must be finite, got {value!r}")
    if isinstance(lo, tuple) and not value > lo[0]:
        raise ValueError(f"GamParams.{name} must be > {lo[0]}, got {value!r}")
    if lo is not None and not isinstance(lo, tuple) and value < lo:
        raise ValueError(f"GamParams.{name} must be >= {lo}, got {value!r}")
    if hi is not None and value > hi:
        raise ValueError(f"GamParams.{name} must be <= {hi}, got {value!r}")


@dataclass(frozen=True)
class GamParams:
    """Every GAM setting (defaults chosen on LoCoMo dev, see docs/gam.md).

    Write path: ``segmentation`` (:data:`SEGMENTATIONS`, or any ``tokens<N>`` /
    ``turns<N>``), ``window``, ``theta``, ``min_events``, ``max_tokens`` (the semantic
    rule), ``noise``/``noise_seed`` (boundary noise), ``epg_window`` (local link
    look-back), ``summaries`` (c_sum source), ``tan_m``, ``tan_candidates``,
    ``conf_min``, ``min_earlier`` (TAN linking). Read path: ``alpha`` (BM25 weight of
    the fusion), ``anchors``, ``gamma`` (topic prior), ``eta`` (EPG neighbour term),
    ``beta_time``, ``beta_role``, ``beta_conf`` (multiplicative factors, ``> 0``).
    Switches: ``tan``, ``epg``, ``mfr`` (the ablations).

    Raises:
        ValueError: a setting of the wrong type, not finite, or out of range (one line
            naming it), when the settings are made or changed with :meth:`with_`.
    """

    segmentation: str = "semantic"
    window: int = 3
    theta: float = 0.6
    min_events: int = 4
    max_tokens: int = 2048
    noise: float = 0.0
    noise_seed: int = 0
    epg_window: int = 4
    summaries: Any = "offline"
    tan_m: int = 30
    tan_candidates: int = 5
    conf_min: float = 0.5
    min_earlier: int = 3
    alpha: float = 1.0
    anchors: int = 8
    gamma: float = 2.0
    eta: float = 0.6
    beta_time: float = 1.4
    beta_role: float = 1.4
    beta_conf: float = 1.2
    tan: bool = True
    epg: bool = True
    mfr: bool = True

    def __post_init__(self) -> None:
        parse_segmentation(self.segmentation)
        for f in fields(self):
            if f.name in _CHECKS:
                _check(f.name, getattr(self, f.name))

    def with_(self, **kw) -> "GamParams":
        """A copy with the settings ``kw`` changed (checked like the constructor's)."""
        return replace(self, **kw)
