"""The tuned winner of one problem key, as stored in the database, table files and dispatch tables.

This module is light (no SQLAlchemy): dispatch reads tables at start-up through it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ._problem import DTYPES, MAX_DIM, MAX_SMS, MAX_WORLD_SIZE, ProblemKey

#: Device types a record can be measured on; ``cpu`` records are never served to GPUs.
DEVICE_TYPES: tuple[str, ...] = ("cuda", "cpu")

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEY_TEXT_RE = re.compile(r"^[^|,=\s]+$")
_INT_RE = re.compile(r"^[+-]?[0-9]+$")

#: Fields of :meth:`WinnerRecord.to_dict`, in output order (``speedup`` is derived, accepted on input).
RECORD_FIELDS: tuple[str, ...] = (
    "op",
    "gpu_model",
    "world_size",
    "dtype",
    "shape",
    "layout",
    "variant",
    "params",
    "median_us",
    "bsp_us",
    "speedup",
    "trials",
    "arch",
    "num_sms",
    "device_type",
    "kernel_hash",
    "env",
    "measured_at",
)


class RecordError(ValueError):
    """A malformed record; the message names where it came from and the field."""

    def __init__(self, where: str, field: str, problem: str) -> None:
        self.where = where
        self.field = field
        self.problem = problem
        super().__init__(f"{where}: field {field!r}: {problem}")


def timing_of(env: Any) -> str:
    """``eager`` or ``graph``: how a record with environment ``env`` was timed (``env["timing"]``, stamped
    by the tuner; records from before the stamp were eager, the tuner's default)."""
    return str(env.get("timing") or "eager") if isinstance(env, Mapping) else "eager"


def is_partial(env: Any) -> bool:
    """Whether a record with environment ``env`` came from a search that has not ended (``env["search"] ==
    "partial"``, stamped by the tuner while a key's study runs and when its time ran out): a later run of
    the same study may still find a faster configuration (``autotaxer.warmup`` resumes it)."""
    return isinstance(env, Mapping) and env.get("search") == "partial"


def is_confirmed(env: Any) -> bool:
    """Whether a record's times were confirmed (``env["confirmed"]``, stamped by the tuner when a key's
    search ended): its winner and the forms it is compared with re-timed side by side on fresh inputs,
    so its speedup is that ratio, not the best of many trials over one sample of each form. Records from
    before the stamp, and those of a search still running, are not."""
    return isinstance(env, Mapping) and bool(env.get("confirmed"))


def confirmed_times(env: Any) -> dict[str, float]:
    """Each entry's µs in a record's confirmation (``env["confirmed_us"]``: ``bsp=100.2,push=61.5``), e.g.
    to read its winner's speedup over torch's fused op; empty for a record without one."""
    text = env.get("confirmed_us") if isinstance(env, Mapping) else None
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        name, sep, value = item.partition("=")
        try:
            out[name] = float(value) if sep else math.nan
        except ValueError:
            continue
    return {k: v for k, v in out.items() if math.isfinite(v)}


#: ``env`` entries that ``autotaxer.warmup``'s in-step check stamps (:mod:`autotaxer.tuner.in_step`):
#: ``in_step`` is ``kept`` (the winner made the user's step faster than plain BSP by more than noise),
#: ``replaced`` (it did not: the record is the arm served instead, the key's fastest form or ``bsp``;
#: ``in_step_winner`` names the isolated winner turned down) or ``unchecked`` (no budget left, or the
#: check was off); ``in_step_gain`` is the step's time with the compared arm (``bsp`` when kept, the
#: arm served when replaced) over its time with the winner (> 1: the winner speeds the step up);
#: ``in_step_joint``, on a winner kept because it and the check's other near misses together sped the step
#: up (:mod:`autotaxer.tuner.in_step_joint`), their joint gain.
IN_STEP, IN_STEP_GAIN, IN_STEP_WINNER = "in_step", "in_step_gain", "in_step_winner"
IN_STEP_JOINT = "in_step_joint"
#: ``env`` entries naming the key's fastest form users have without autotaxer (a BSP form or torch's fused
#: op): ``fastest_form`` as the tuner measured it alone (what dispatch serves untuned keys near it), after
#: an in-step check the one fastest in the step; ``fastest_form_isolated``, where they differ, the one
#: fastest alone (:mod:`autotaxer.tuner.in_step`).
FASTEST_FORM, FASTEST_FORM_ISOLATED = "fastest_form", "fastest_form_isolated"


def in_step_of(env: Any) -> tuple[str | None, float | None]:
    """``(status, gain)`` of warm-up's in-step check from a record's environment ``env`` (``(None, None)``
    for a record no warm-up checked; the gain is None when unchecked or unreadable)."""
    if not isinstance(env, Mapping) or env.get(IN_STEP) is None:
        return None, None
    return str(env[IN_STEP]), _finite(env, IN_STEP_GAIN)


def isolated_fastest_form(env: Any) -> str | None:
    """The form users have without autotaxer that ran fastest *alone* at a record's key: the in-step check
    re-stamps ``env["fastest_form"]`` with the step's fastest and keeps the isolated one in
    ``env["fastest_form_isolated"]`` where they differ; None when the record names none."""
    if not isinstance(env, Mapping):
        return None
    name = env.get(FASTEST_FORM_ISOLATED) or env.get(FASTEST_FORM)
    return str(name) if name else None


def in_step_joint_of(env: Any) -> float | None:
    """The joint gain a winner was kept with by warm-up's check of near misses (``env["in_step_joint"]``);
    None when it was kept alone, not kept, or the value is unreadable."""
    return _finite(env, IN_STEP_JOINT) if isinstance(env, Mapping) else None


def _finite(env: Mapping, name: str) -> float | None:
    """``env[name]`` as a finite float; None when absent or unreadable."""
    try:
        value = float(env[name]) if env.get(name) is not None else None
    except ValueError:
        value = None
    return value if value is None or math.isfinite(value) else None


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def to_utc(value: datetime) -> datetime:
    """An aware UTC datetime; a naive one is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


@dataclass(frozen=True)
class WinnerRecord:
    """The fastest configuration found for one problem key, and where it was measured."""

    key: ProblemKey
    variant: str
    params: Mapping[str, Any]  # JSON scalars (str/int/float/bool/None); stored as a plain dict
    median_us: float
    bsp_us: float
    trials: int
    arch: str = ""
    num_sms: int = 0
    env: Mapping[str, str | None] = field(default_factory=dict)
    kernel_hash: str | None = None
    measured_at: datetime = field(default_factory=_utc_now)
    device_type: str = "cuda"

    def __post_init__(self) -> None:
        _check_record(self, "WinnerRecord")
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "median_us", float(self.median_us))
        object.__setattr__(self, "bsp_us", float(self.bsp_us))
        object.__setattr__(self, "measured_at", to_utc(self.measured_at))

    @property
    def speedup(self) -> float:
        """BSP time over the winner's time (>1 means the winner beats the baseline)."""
        return self.bsp_us / self.median_us

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (the layout of exported tables)."""
        k = self.key
        return {
            "op": k.op,
            "gpu_model": k.gpu_model,
            "world_size": k.world_size,
            "dtype": k.dtype,
            "shape": dict(k.shape),
            "layout": dict(k.layout),
            "variant": self.variant,
            "params": dict(self.params),
            "median_us": self.median_us,
            "bsp_us": self.bsp_us,
            "speedup": self.speedup,
            "trials": self.trials,
            "arch": self.arch,
            "num_sms": self.num_sms,
            "device_type": self.device_type,
            "kernel_hash": self.kernel_hash,
            "env": dict(self.env),
            "measured_at": self.measured_at.isoformat(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str, *, text: bool = False) -> WinnerRecord:
        """Parse :meth:`to_dict`'s layout; ``RecordError`` names ``where`` and the field.

        ``text=True`` accepts numbers, shapes (``M=8,N=16``) and JSON objects as strings (CSV rows).
        """
        if not isinstance(d, Mapping):
            raise RecordError(where, "<record>", f"expected an object, got {type(d).__name__}")
        unknown = sorted(set(d) - set(RECORD_FIELDS))
        if unknown:
            raise RecordError(where, unknown[0], "unknown field")
        required = ("op", "gpu_model", "world_size", "dtype", "shape", "variant", "median_us", "bsp_us")
        for name in (*required, "trials"):
            if name not in d:
                raise RecordError(where, name, "missing")
        p = _Parser(where, text)
        key = ProblemKey.make(
            op=p.name_text(d, "op"),
            gpu_model=p.name_text(d, "gpu_model"),
            world_size=p.integer(d, "world_size", minimum=1, maximum=MAX_WORLD_SIZE),
            dtype=p.string(d, "dtype"),
            shape=p.pairs(d, "shape"),
            layout=p.pairs(d, "layout", required=False, names=True),
        )
        try:
            return cls(
                key=key,
                variant=p.string(d, "variant"),
                params=p.mapping(d, "params", required=False),
                median_us=p.number(d, "median_us"),
                bsp_us=p.number(d, "bsp_us"),
                trials=p.integer(d, "trials", minimum=0, maximum=MAX_DIM),
                arch=p.string(d, "arch", default=""),
                num_sms=p.integer(d, "num_sms", minimum=0, default=0, maximum=MAX_SMS),
                env=p.mapping(d, "env", required=False),
                kernel_hash=p.optional_string(d, "kernel_hash"),
                measured_at=p.timestamp(d, "measured_at"),
                device_type=p.string(d, "device_type", default="cuda"),
            )
        except RecordError as e:
            raise RecordError(where, e.field, e.problem) from None


class _Parser:
    """Field readers for :meth:`WinnerRecord.from_dict` (each error names ``where`` and the field)."""

    def __init__(self, where: str, text: bool) -> None:
        self.where = where
        self.text = text

    def fail(self, name: str, problem: str) -> RecordError:
        return RecordError(self.where, name, problem)

    def string(self, d: Mapping[str, Any], name: str, default: str | None = None) -> str:
        value = d.get(name, default)
        if not isinstance(value, str):
            raise self.fail(name, f"expected a string, got {value!r}")
        return value

    def optional_string(self, d: Mapping[str, Any], name: str) -> str | None:
        value = d.get(name)
        if value is None or (self.text and value == ""):
            return None
        return self.string(d, name)

    def name_text(self, d: Mapping[str, Any], name: str) -> str:
        value = self.string(d, name)
        if not _KEY_TEXT_RE.match(value):
            raise self.fail(name, f"must be non-empty without '|', ',', '=' or spaces, got {value!r}")
        return value

    def integer(
        self,
        d: Mapping[str, Any],
        name: str,
        minimum: int,
        default: int | None = None,
        maximum: int = MAX_DIM,
    ) -> int:
        value = d.get(name, default)
        if self.text and isinstance(value, str) and _INT_RE.match(value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"not an integer: {value!r}")
        if value < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {value}")
        if value > maximum:
            raise self.fail(name, f"must be <= {maximum}, got {value}")
        return value

    def number(self, d: Mapping[str, Any], name: str) -> float:
        value = d.get(name)
        if self.text and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise self.fail(name, f"not a number: {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(name, f"not a number: {value!r}")
        return float(value)

    def pairs(
        self, d: Mapping[str, Any], name: str, required: bool = True, names: bool = False
    ) -> dict[str, Any]:
        """``name: integer`` pairs (``names``: a value may also be a short name, e.g. ``b_layout: nk``)."""
        value = d.get(name, None if required else {})
        if self.text and isinstance(value, str):
            value = _parse_pairs_text(value, lambda problem: self.fail(name, problem), names)
        if not isinstance(value, Mapping):
            raise self.fail(name, f"expected an object of name: integer, got {value!r}")
        if required and not value:
            raise self.fail(name, "must not be empty")
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str) or not _NAME_RE.match(k):
                raise self.fail(name, f"bad field name {k!r}")
            if names and isinstance(v, str) and _NAME_RE.match(v):
                out[k] = v
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                raise self.fail(name, f"{k}: not an integer: {v!r}")
            if not 0 <= v <= MAX_DIM:
                raise self.fail(name, f"{k}: must be <= {MAX_DIM}, got {v}")
            out[k] = v
        return out

    def mapping(self, d: Mapping[str, Any], name: str, required: bool = True) -> dict[str, Any]:
        value = d.get(name, None if required else {})
        if self.text and isinstance(value, str):
            import json

            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as e:
                raise self.fail(name, f"not valid JSON: {e.msg}") from None
        if not isinstance(value, Mapping):
            raise self.fail(name, f"expected an object, got {value!r}")
        return dict(value)

    def timestamp(self, d: Mapping[str, Any], name: str) -> datetime:
        value = d.get(name)
        if value is None or (self.text and value == ""):
            raise self.fail(name, "missing")
        if not isinstance(value, str):
            raise self.fail(name, f"expected an ISO 8601 timestamp, got {value!r}")
        try:
            return to_utc(datetime.fromisoformat(value))
        except ValueError:
            raise self.fail(name, f"not an ISO 8601 timestamp: {value!r}") from None


def _parse_pairs_text(text: str, fail, names: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not text.strip():
        return out
    for item in text.split(","):
        name, eq, value = item.partition("=")
        value = value.strip()
        if eq and names and _NAME_RE.match(value):
            out[name.strip()] = value
            continue
        if not eq or not _INT_RE.match(value):
            raise fail(f"expected name=integer pairs separated by ',', got {text!r}")
        out[name.strip()] = int(value)
    return out


#: The times a record may hold, in microseconds: no call (a kernel launch at least) is faster than 0.1 us,
#: and none that a tuner measured took an hour. Within them every speedup is a finite number.
MIN_CALL_US = 0.1
MAX_CALL_US = 3.6e9


def _is_json_scalar(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int)):
        return True
    return isinstance(value, float) and math.isfinite(value)


def _check_record(r: WinnerRecord, where: str) -> None:
    """Raise :class:`RecordError` for values the database and tables cannot hold."""

    def fail(name: str, problem: str) -> RecordError:
        return RecordError(where, name, problem)

    if not isinstance(r.key, ProblemKey):
        raise fail("key", f"expected a ProblemKey, got {type(r.key).__name__}")
    _check_key(r.key, fail)
    if not isinstance(r.variant, str) or not r.variant:
        raise fail("variant", f"must be a non-empty string, got {r.variant!r}")
    if not isinstance(r.params, Mapping):
        raise fail("params", f"expected a mapping, got {type(r.params).__name__}")
    for k, v in r.params.items():
        if not isinstance(k, str):
            raise fail("params", f"parameter names must be strings, got {k!r}")
        if not _is_json_scalar(v):
            raise fail("params", f"{k}: must be a str/int/float/bool/null, got {v!r}")
    for name in ("median_us", "bsp_us"):
        value = getattr(r, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail(name, f"not a number: {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise fail(name, f"must be a positive finite number, got {value!r}")
        if not MIN_CALL_US <= value <= MAX_CALL_US:
            expected = f"expected {MIN_CALL_US} to {MAX_CALL_US:g} us"
            raise fail(name, f"{value!r} us is not a time one call can take ({expected})")
    for name, maximum in (("trials", MAX_DIM), ("num_sms", MAX_SMS)):
        value = getattr(r, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise fail(name, f"must be an integer >= 0, got {value!r}")
        if value > maximum:
            raise fail(name, f"must be <= {maximum}, got {value}")
    if not isinstance(r.arch, str):
        raise fail("arch", f"expected a string, got {r.arch!r}")
    if not isinstance(r.env, Mapping):
        raise fail("env", f"expected a mapping, got {type(r.env).__name__}")
    for k, v in r.env.items():
        if not isinstance(k, str) or not (v is None or isinstance(v, str)):
            raise fail("env", f"entries must be name: string or null, got {k!r}: {v!r}")
    if r.kernel_hash is not None and not isinstance(r.kernel_hash, str):
        raise fail("kernel_hash", f"expected a string or null, got {r.kernel_hash!r}")
    if not isinstance(r.measured_at, datetime):
        raise fail("measured_at", f"expected a datetime, got {r.measured_at!r}")
    if r.device_type not in DEVICE_TYPES:
        raise fail("device_type", f"must be one of {', '.join(DEVICE_TYPES)}, got {r.device_type!r}")


def _check_key(key: ProblemKey, fail) -> None:
    for name in ("op", "gpu_model"):
        value = getattr(key, name)
        if not isinstance(value, str) or not _KEY_TEXT_RE.match(value):
            raise fail(name, f"must be non-empty without '|', ',', '=' or spaces, got {value!r}")
    ws = key.world_size
    if isinstance(ws, bool) or not isinstance(ws, int) or ws < 1:
        raise fail("world_size", f"must be an integer >= 1, got {ws!r}")
    if ws > MAX_WORLD_SIZE:
        raise fail("world_size", f"must be <= {MAX_WORLD_SIZE}, got {ws}")
    if key.dtype not in DTYPES:
        raise fail("dtype", f"must be one of {', '.join(DTYPES)}, got {key.dtype!r}")
    if not key.shape:
        raise fail("shape", "must not be empty")
    for part, minimum in (("shape", 1), ("layout", 0)):
        for name, value in getattr(key, part):
            if not _NAME_RE.match(name):
                raise fail(part, f"bad field name {name!r}")
            if part == "layout" and isinstance(value, str):
                if not _NAME_RE.match(value):
                    raise fail(part, f"{name}: bad value {value!r}")
                continue
            if value < minimum:
                raise fail(part, f"{name}: must be >= {minimum}, got {value}")
            if value > MAX_DIM:
                raise fail(part, f"{name}: must be <= {MAX_DIM}, got {value}")
