"""GAM's settings and the names the command line offers (no tensor code: importing this
module imports neither torch nor numpy).

* :class:`GamParams`: every setting, checked when made (a wrong type, a NaN or an
  out-of-range value is a :class:`~memgas_gpu.settings.SettingsError` naming the
  field), copied with ``replace(**changes)``.
* :data:`SEGMENTATIONS` and :func:`parse_segmentation`: the topic segmentations.
* :data:`FLAT_METHODS`: flat utterance baselines over the same events and signals.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..settings import Settings, SettingsError, setting

__all__ = ["GamParams", "SEGMENTATIONS", "parse_segmentation", "FLAT_METHODS"]

#: segmentation strategies: semantic boundaries (GAM), fixed token windows, fixed
#: utterance counts, sessions, and one topic per utterance (no buffering)
SEGMENTATIONS = ("semantic", "tokens256", "tokens512", "turns3", "turns5", "session", "event")
#: flat utterance retrieval over the same events and signals (no topics)
FLAT_METHODS = ("flat_dense", "flat_bm25", "flat_fusion")
_SPEC = re.compile(r"^(semantic|session|event|tokens(\d{1,9})|turns(\d{1,9}))$")


def parse_segmentation(spec: Any) -> tuple[str, int]:
    """``"tokens256"`` → ``("tokens", 256)``, ``"semantic"`` → ``("semantic", 0)``;
    :class:`~memgas_gpu.settings.SettingsError` for anything else."""
    m = _SPEC.match(spec) if isinstance(spec, str) else None
    if not m or (m.group(2) is not None and int(m.group(2)) < 1) or \
            (m.group(3) is not None and int(m.group(3)) < 1):
        raise SettingsError(f"unknown segmentation {spec!r}: use semantic, session, event, "
                            "tokens<N> or turns<N> (e.g. tokens256, turns3)")
    if m.group(2):
        return "tokens", int(m.group(2))
    if m.group(3):
        return "turns", int(m.group(3))
    return m.group(1), 0


def _segmentation(name: str, value: Any) -> str:
    parse_segmentation(value)
    return value


_POSITIVE = dict(kind="real", lo=0.0, lo_open=True)
_FRACTION = dict(kind="real", lo=0.0, hi=1.0)


@dataclass(frozen=True)
class GamParams(Settings):
    """Every GAM setting (defaults chosen on LoCoMo dev, see docs/gam.md).

    Write path: ``segmentation`` (:data:`SEGMENTATIONS`, or any ``tokens<N>`` /
    ``turns<N>``), ``window``, ``theta`` (a threshold on 1 - cos, in [0, 2]),
    ``min_events``, ``max_tokens`` (the semantic rule), ``noise``/``noise_seed``
    (boundary noise), ``epg_window`` (local link look-back), ``summaries`` (c_sum
    source), ``tan_m``, ``tan_candidates``, ``conf_min``, ``min_earlier`` (TAN linking).
    Read path: ``alpha`` (BM25 weight of the fusion), ``anchors`` (>= 1), ``gamma`` (topic
    prior), ``eta`` (EPG neighbour term), ``beta_time``, ``beta_role``, ``beta_conf``
    (multiplicative factors, ``> 0``). Switches: ``tan``, ``epg``, ``mfr`` (the
    ablations).

    Raises:
        SettingsError: a setting of the wrong type, not finite, or out of range (one line
            naming it), when the settings are made or changed with ``replace``.
    """

    segmentation: str = setting("semantic", "custom", convert=_segmentation)
    window: int = setting(3, "int", lo=1)
    theta: float = setting(0.6, "real", lo=0.0, hi=2.0)
    min_events: int = setting(4, "int", lo=0)
    max_tokens: int = setting(2048, "int", lo=1)
    noise: float = setting(0.0, **_FRACTION)
    noise_seed: int = setting(0, "int", lo=0)
    epg_window: int = setting(4, "int", lo=1)
    summaries: Any = setting("offline", "any")
    tan_m: int = setting(30, "int", lo=1)
    tan_candidates: int = setting(5, "int", lo=0)
    conf_min: float = setting(0.5, **_FRACTION)
    min_earlier: int = setting(3, "int", lo=0)
    alpha: float = setting(1.0, "real")
    anchors: int = setting(8, "int", lo=1)
    gamma: float = setting(2.0, "real")
    eta: float = setting(0.6, "real")
    beta_time: float = setting(1.4, **_POSITIVE)
    beta_role: float = setting(1.4, **_POSITIVE)
    beta_conf: float = setting(1.2, **_POSITIVE)
    tan: bool = setting(True, "bool")
    epg: bool = setting(True, "bool")
    mfr: bool = setting(True, "bool")
