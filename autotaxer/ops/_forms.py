"""What an op declares to take part in autotaxer's integrations beyond dispatch and tuning.

An op names the integrations it takes part in (``Op.integrations``, kinds of :data:`INTEGRATION_KINDS`);
their forms are the classes below: ``compiled`` (:class:`CompiledForm`, torch.compile), ``autograd``
(:class:`AutogradForm`), ``functions`` (name -> function of :mod:`autotaxer.functional`), ``bench``
(:class:`BenchForm`) and ``emulated`` (:class:`EmulatedForm`, ranks emulated in one process). The
integration layer above the ops (:mod:`autotaxer.integrations`) holds the built-in ops' forms and finds
each by the op's name; a form that needs nothing above the ops (the emulated checks, a plugin op's bench
parts) the op carries itself (``Op.forms``). The layer an op can serve is data on the op itself
(:class:`LayerForm`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The integrations an op may take part in (``Op.integrations``).
INTEGRATION_KINDS = ("compiled", "autograd", "functions", "bench", "emulated")

#: The tensor-parallel linear layers of :mod:`autotaxer.nn`: ``column`` gathers the input's rows over the
#: ranks and shards the weight's output features; ``row`` shards the input features and scatters the
#: output's rows.
LAYER_ROLES = ("column", "row")


@dataclass(frozen=True)
class LayerForm:
    """The tensor-parallel linear layer an op can serve: ``role`` (one of :data:`LAYER_ROLES`) and the
    layout keywords dispatch takes for it (e.g. ``{"gather_dim": 0}``)."""

    role: str
    layout: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.role not in LAYER_ROLES:
            raise ValueError(f"role: expected one of {', '.join(LAYER_ROLES)}, got {self.role!r}")


def _never(a: Any, b: Any) -> bool:
    return False


@dataclass(frozen=True)
class CompiledForm:
    """How ``torch.compile`` traces a call ``(a, b, <field>=dim)`` of the op
    (:mod:`autotaxer.integrations.compiled`).

    ``plain(a, b, dim, group_name)``: BSP as plain PyTorch writes it (functional collectives and the
    matmul, traceable and differentiable), ``(output, saved or None)``. ``opaque(a, b, dim, group_name)``:
    the op's custom op, opaque to the compiler, served by the key's winner whatever it can hand out
    (differentiable where its backward needs nothing the forward kept). ``saving(a, b, dim, group_name)``:
    ``(output, saved)`` of the custom op that also returns what backward keeps, or None.
    ``backward_keeps(a, b)``: whether a differentiable call's backward needs what the forward kept
    (``ag_gemm``: the gathered A, when ``b`` requires grad)."""

    field: str
    plain: Callable[..., tuple[Any, Any]]
    opaque: Callable[..., Any]
    saving: Callable[..., tuple[Any, Any]] | None = None
    backward_keeps: Callable[[Any, Any], bool] = _never


@dataclass(frozen=True)
class AutogradForm:
    """How dispatch differentiates the op: ``call(tensors, plan, path, keep)`` returns ``(output, saved or
    None)``, both differentiable; ``keep``: the caller needs what backward keeps (``saved``). The forward
    runs ``plan.forward(tensors, path, save)`` (the winner, or with ``save`` the form that hands out what
    backward keeps), ``save`` true only where the caller or this call's backward needs it; ``path`` is
    the call path it is counted under (:func:`autotaxer.served`)."""

    call: Callable[[tuple, Any, str, bool], tuple[Any, Any]]


@dataclass(frozen=True)
class Peer:
    """An implementation of the op outside autotaxer that a bench row is compared with.

    ``applies(key)``: whether it runs ``key``. ``make(key, ctx, inputs)``: a callable computing the output
    (what is timed; its result is checked against the reference), on ``device_types``. ``alone``: always
    timed in a process group of its own, after the main run (a kernel that may hang); ``apart_from``:
    variants whose presence in the row also sends it to a group of its own, timed there beside BSP.
    ``group_by(key)``: the cases sharing one such group."""

    applies: Callable[[Any], bool]
    make: Callable[[Any, Any, tuple], Callable[[], Any]]
    device_types: frozenset[str] = frozenset({"cuda"})
    alone: bool = False
    apart_from: frozenset[str] = frozenset()
    group_by: Callable[[Any], Any] = lambda key: None


@dataclass(frozen=True)
class BenchForm:
    """What ``autotaxer bench`` times in a row of the op besides BSP, its variants and dispatch.

    ``parts(key, ctx, inputs, bsp_workspace)``: ``{name: callable}``, the pieces BSP is made of, each timed
    alone (``comm``: the communication alone, then the local compute alone; a fused form's ceiling is the
    slower of them). ``peers``: name -> :class:`Peer`."""

    parts: Callable[..., dict[str, Callable[[], Any]]]
    peers: Mapping[str, Peer] = field(default_factory=dict)


@dataclass(frozen=True)
class EmulatedForm:
    """Checks of the op's kernels on ranks emulated in one process (:mod:`autotaxer.ops._emulated_heap`,
    run by :mod:`autotaxer.tools.emulated_ranks`):
    ``checks``: name -> a function returning ``"OK ..."`` (``AssertionError`` naming what differed);
    ``never_signal``: kind -> a function running rank 0's kernel of that kind whose peers never signal."""

    checks: Mapping[str, Callable[..., str]] = field(default_factory=dict)
    never_signal: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
