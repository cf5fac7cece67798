"""The problem key shared by the tuner, the tuning database and dispatch.

A problem key is ``(op, gpu_model, world_size, dtype, shape..., layout...)``. Shape and layout are
stored as sorted-by-declaration tuples of ``(name, value)`` so a key is hashable, comparable and has
one canonical text form (``ProblemKey.text``) that the database's unique constraint and exported
tables use. Shape values are integers; layout values are integers (``gather_dim=0``) or short names
(``b_layout=nk``).

A layout field added after tables were shipped keeps their keys: its default value
(:data:`IMPLICIT_LAYOUT`, e.g. ``b_layout=kn``) is left out of the key, so a key without the field and
one that names its default are the same key, with the same text, and ``key["b_layout"]`` reads the
default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Layout fields whose default is implied when absent (and dropped when given): tables written before the
#: field existed hold exactly these keys. ``b_layout``: ``kn`` = B row-major ``(K, N)``; ``nk`` = B is the
#: transpose of a row-major ``(N, K)`` weight (``linear.weight.t()``).
IMPLICIT_LAYOUT: dict[str, str | int] = {"b_layout": "kn"}

LayoutValue = int | str

#: Layout names in short texts (:attr:`ProblemKey.short_text`, bench tables).
SHORT_LAYOUT = {"gather_dim": "gd"}

#: Largest shape or layout value anywhere (shapes files, tables, the database): torch's and Triton's
#: 32-bit index range; a larger problem cannot run, so it is refused where it is read.
MAX_DIM = 2**31 - 1
#: Largest world size (and SM count) a key or record may name.
MAX_WORLD_SIZE = 65536
MAX_SMS = 1 << 20

#: Short dtype names accepted in shapes files, tables and on the command line.
DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp32")


def torch_dtype(name: str):
    """Map a short dtype name (``bf16``, ``fp16``, ``fp32``) to a ``torch.dtype``."""
    import torch

    table = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if name not in table:
        raise ValueError(f"dtype: unknown dtype {name!r} (expected one of {', '.join(DTYPES)})")
    return table[name]


def dtype_name(dtype) -> str:
    """Map a ``torch.dtype`` back to its short name."""
    import torch

    table = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
    if dtype not in table:
        raise ValueError(f"dtype: unsupported tensor dtype {dtype} (expected bf16, fp16 or fp32)")
    return table[dtype]


@dataclass(frozen=True)
class Target:
    """The machine a problem runs on: normalized GPU model, arch and SM/CU count.

    ``device_type`` is ``"cuda"`` (NVIDIA and AMD through torch.cuda) or ``"cpu"``; CPU targets have
    ``gpu_model == "cpu"`` so CPU measurements are never served to GPUs.
    """

    gpu_model: str
    arch: str
    num_sms: int
    device_type: str = "cuda"

    @property
    def is_nvidia(self) -> bool:
        return self.gpu_model.startswith("nvidia")

    @property
    def is_amd(self) -> bool:
        return self.gpu_model.startswith("amd")


@dataclass(frozen=True)
class ProblemKey:
    """One tunable problem: ``(op, gpu_model, world_size, dtype, shape..., layout...)``."""

    op: str
    gpu_model: str
    world_size: int
    dtype: str
    shape: tuple[tuple[str, int], ...]
    layout: tuple[tuple[str, LayoutValue], ...] = ()

    @classmethod
    def make(
        cls,
        op: str,
        gpu_model: str,
        world_size: int,
        dtype: str,
        shape: Mapping[str, int],
        layout: Mapping[str, LayoutValue] | None = None,
    ) -> ProblemKey:
        """Build a key from mappings, keeping the order in which fields are given; layout fields equal
        to their :data:`IMPLICIT_LAYOUT` default are left out."""
        return cls(
            op=op,
            gpu_model=gpu_model,
            world_size=int(world_size),
            dtype=dtype,
            shape=tuple((k, int(v)) for k, v in shape.items()),
            layout=tuple(
                (k, _layout_value(v))
                for k, v in (layout or {}).items()
                if not (k in IMPLICIT_LAYOUT and _layout_value(v) == IMPLICIT_LAYOUT[k])
            ),
        )

    def __getitem__(self, name: str) -> LayoutValue:
        for k, v in self.shape + self.layout:
            if k == name:
                return v
        if name in IMPLICIT_LAYOUT:
            return IMPLICIT_LAYOUT[name]
        raise KeyError(name)

    def get(self, name: str, default: LayoutValue | None = None) -> LayoutValue | None:
        try:
            return self[name]
        except KeyError:
            return default

    @property
    def shape_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.shape)

    @property
    def layout_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.layout)

    @property
    def short_text(self) -> str:
        """A compact form for narrow tables: ``bf16 M=8 N=8192 K=8192 gd=0 nk`` (the op, GPU and world
        size are the table's title)."""
        layout = [v if isinstance(v, str) else f"{SHORT_LAYOUT.get(k, k)}={v}" for k, v in self.layout]
        return " ".join([self.dtype, *(f"{k}={v}" for k, v in self.shape), *layout])

    @property
    def text(self) -> str:
        """Canonical one-line form, e.g. ``ag_gemm|nvidia-h200|2|bf16|M=8,N=8192,K=8192|gather_dim=0``."""
        return "|".join(
            [self.op, self.gpu_model, str(self.world_size), self.dtype, self.shape_text, self.layout_text]
        )

    @classmethod
    def from_text(cls, text: str) -> ProblemKey:
        """Parse :attr:`text` back into a key."""
        parts = text.split("|")
        if len(parts) != 6:
            raise ValueError(f"problem key: expected 6 '|'-separated fields, got {text!r}")
        op, gpu, ws, dtype, shape, layout = parts
        return cls.make(op, gpu, int(ws), dtype, _parse_pairs(shape), _parse_pairs(layout))

    def with_shape(self, **changes: int) -> ProblemKey:
        """A copy with some shape fields changed (used by nearest-M lookup)."""
        return ProblemKey(
            self.op,
            self.gpu_model,
            self.world_size,
            self.dtype,
            tuple((k, int(changes.get(k, v))) for k, v in self.shape),
            self.layout,
        )


def _layout_value(value: LayoutValue) -> LayoutValue:
    """A layout value as stored: names stay strings, everything else becomes an int."""
    return value if isinstance(value, str) else int(value)


def _parse_pairs(text: str) -> dict[str, LayoutValue]:
    out: dict[str, LayoutValue] = {}
    if not text:
        return out
    for item in text.split(","):
        name, _, value = item.partition("=")
        out[name] = int(value) if value.lstrip("+-").isdigit() else value
    return out
