"""GAM methods: the full system and the paper's ablations, as :class:`GamParams` presets.

* ``gam`` — everything (semantic boundaries, EPG, TAN, multi-factor re-ranking).
* ``gam_no_tan`` — no Topic Associative Network: anchors are not expanded to neighbours.
* ``gam_no_epg`` — no Event Progression Graph: events are not memory units; a question
  retrieves topics (c_sum + c_raw) and their events follow in order.
* ``gam_no_ssm`` — no state switching: every utterance is consolidated at once (one
  event per topic: the unified streaming memory the paper contrasts with). The fixed
  segmentations are separate (``--segmentation``).
* ``gam_no_mfr`` — no multi-factor re-ranking: relevance only (no time, role or
  confidence factor).

This module is the one list of GAM's method names: the command line imports it (it
imports neither torch nor numpy), and tests/test_gam_cli.py checks every other place
that names them.
"""
from __future__ import annotations

from typing import Optional

from .params import FLAT_METHODS, GamParams

__all__ = ["GAM_METHODS", "METHODS", "preset"]

_CHANGES = {"gam": {}, "gam_no_tan": {"tan": False}, "gam_no_epg": {"epg": False},
            "gam_no_ssm": {"segmentation": "event"}, "gam_no_mfr": {"mfr": False}}
#: GAM and its ablations (they rank utterances through the hierarchy)
GAM_METHODS = tuple(_CHANGES)
#: every method name :func:`preset` and the CLI accept
METHODS = GAM_METHODS + FLAT_METHODS


def preset(method: str, base: Optional[GamParams] = None) -> GamParams:
    """The settings of ``method`` on top of ``base`` (default :class:`GamParams`)."""
    base = base or GamParams()
    if method in FLAT_METHODS:
        return base
    if method not in _CHANGES:
        raise ValueError(f"unknown GAM method {method!r}; choose from {', '.join(METHODS)}")
    return base.replace(**_CHANGES[method])
