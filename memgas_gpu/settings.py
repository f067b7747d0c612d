"""One idiom for every settings object (no torch, no numpy: the command line reads it).

:class:`~memgas_gpu.retrieve.ReadParams`, :class:`~memgas_gpu.retrieve.BuildParams`,
:class:`~memgas_gpu.retrieve.GraphParams` and :class:`~memgas_gpu.gam.GamParams` are
frozen dataclasses built on :class:`Settings`:

* every field declares what it accepts with :func:`setting` (a kind, bounds or
  choices, finiteness), and is checked when the object is made;
* ``params.replace(**changes)`` is a checked copy; a name that is not a field is refused;
* every refusal is a :class:`SettingsError` whose message starts with the field's name,
  e.g. ``temperature must be > 0, got 0``.

The command line derives its option types and defaults from the same specs
(:meth:`Settings.specs`, the class attributes), so the two cannot disagree.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .errors import MemgasError

__all__ = ["SettingsError", "Spec", "setting", "Settings", "KINDS"]

#: what a field can declare: an integer, a finite (by default) real number, True or
#: False, one string of ``choices``, any value, or a value ``convert`` checks
KINDS = ("int", "real", "bool", "choice", "any", "custom")


class SettingsError(MemgasError, ValueError):
    """A setting of the wrong type, out of range, not one of its choices, or not a
    setting at all; the message names it (the CLI reports it in one line)."""


def _show(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Spec:
    """What one field accepts.

    Attributes:
        kind: one of :data:`KINDS`.
        lo, hi: bounds of an ``int`` or ``real`` (None: unbounded on that side).
        lo_open: ``lo`` itself is refused (``real`` only).
        finite: a ``real`` refuses NaN and ±inf.
        choices: the strings a ``choice`` accepts.
        convert: ``convert(name, value)`` of a ``custom`` field: the normalised value,
            or :class:`SettingsError`.
    """

    kind: str
    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    finite: bool = True
    choices: tuple = ()
    convert: Optional[Callable[[str, Any], Any]] = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TypeError(f"unknown setting kind {self.kind!r}; kinds are {', '.join(KINDS)}")
        if (self.kind == "custom") != (self.convert is not None):
            raise TypeError("a custom setting, and only a custom setting, has a convert")

    def check(self, name: str, value: Any) -> Any:
        """``value`` as the field keeps it (an ``int`` as int, a ``real`` as float), or
        :class:`SettingsError` naming ``name``."""
        if self.kind == "any":
            return value
        if self.kind == "custom":
            return self.convert(name, value)
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise SettingsError(f"{name} must be True or False, got {value!r}")
            return value
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                raise SettingsError(f"{name} must be one of {', '.join(self.choices)}, "
                                    f"got {value!r}")
            return value
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or \
                    (self.lo is not None and value < self.lo) or \
                    (self.hi is not None and value > self.hi):
                raise SettingsError(f"{name} must be an integer{self._range()}, got {value!r}")
            return int(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise SettingsError(f"{name} must be a number, got {value!r}")
        try:
            v = float(value)
        except OverflowError:  # an integer too large for a float
            v = math.inf if value > 0 else -math.inf
        if self.finite and not math.isfinite(v):
            raise SettingsError(f"{name} must be finite, got {value!r}")
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            raise SettingsError(f"{name} must be {'>' if self.lo_open else '>='} "
                                f"{_show(self.lo)}, got {value!r}")
        if self.hi is not None and v > self.hi:
            raise SettingsError(f"{name} must be <= {_show(self.hi)}, got {value!r}")
        return v

    def _range(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f" from {_show(self.lo)} to {_show(self.hi)}"
        if self.lo is not None:
            return f" >= {_show(self.lo)}"
        return f" <= {_show(self.hi)}" if self.hi is not None else ""


def setting(default: Any, kind: str, **spec) -> Any:
    """A dataclass field with ``default`` that accepts what :class:`Spec` ``(kind,
    **spec)`` does (the field of a :class:`Settings` class)."""
    return dataclasses.field(default=default, metadata={"setting": Spec(kind, **spec)})


class Settings:
    """Base of the settings dataclasses (declare ``@dataclass(frozen=True)`` and every
    field with :func:`setting`): checked when made, copied with :meth:`replace`."""

    def __post_init__(self) -> None:
        for name, spec in self.specs().items():
            object.__setattr__(self, name, spec.check(name, getattr(self, name)))

    @classmethod
    def specs(cls) -> dict:
        """``{field: Spec}`` in field order."""
        out = {}
        for f in dataclasses.fields(cls):
            if "setting" not in f.metadata:
                raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting()")
            out[f.name] = f.metadata["setting"]
        return out

    def replace(self, **changes):
        """A copy with ``changes`` (field names) replaced, checked like a new object;
        :class:`SettingsError` for a value it refuses or a name that is not a field."""
        known = self.specs()
        bad = sorted(set(changes) - set(known))
        if bad:
            raise SettingsError(f"unknown setting(s) {bad}; settings are "
                                f"{', '.join(sorted(known))}")
        return dataclasses.replace(self, **changes)
