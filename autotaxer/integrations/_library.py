"""The ``autotaxer`` namespace of torch operators, for the ops' ``torch.compile`` integrations.

:func:`define` declares one operator by its schema with one kernel for every device
(``CompositeExplicitAutograd``) and a fake implementation; the caller adds its autograd registration
(``torch.library.register_autograd``). This is what ``torch.library.custom_op`` builds, less its
wrapper: a served call from compiled code pays the dispatcher's hop into Python, not also custom_op's
per-device kernel lookup and guards (on CPU, world size 1: 17.7 against 21.2 µs a call with the autograd
registration, ``bench/dispatch_overhead.py --mode compiled``). The operators are opaque to
``torch.compile`` as custom_op's are: the tracer sees the fake's output, the graph holds the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

NAMESPACE = "autotaxer"
_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")  # kept for the life of the process


def define(name: str, schema: str, kernel: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """Declare ``autotaxer::<name><schema>`` (schema without the name, e.g. ``"(Tensor a) -> Tensor"``),
    served by ``kernel`` on every device and shaped by ``fake`` while tracing; returns its overload
    packet (``torch.ops.autotaxer.<name>``). Functional: the schema declares no mutation or alias."""
    _LIB.define(f"{name}{schema}", tags=(torch.Tag.pt2_compliant_tag,))
    _LIB.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIB)
    return getattr(torch.ops.autotaxer, name)
