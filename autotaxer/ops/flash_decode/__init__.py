"""``flash_decode``: attention of one new token per row over a sequence-sharded KV cache, and its variants.

Each variant module in ``_VARIANT_MODULES`` exposes ``VARIANTS``. Modules import Triton/Iris only inside
their functions, so registering costs nothing on CPU.
"""

from __future__ import annotations

import importlib

from ._emulated import FORM as EMULATED
from ._op import FlashDecode, global_lengths, shard_lengths

_VARIANT_MODULES = ("bsp", "fused")

FLASH_DECODE = FlashDecode()
FLASH_DECODE.integrations = frozenset({"emulated"})  # see ops/_forms.py: a form it carries itself
FLASH_DECODE.forms = {"emulated": EMULATED}
for _name in _VARIANT_MODULES:
    for _variant in importlib.import_module(f"{__name__}.{_name}").VARIANTS:
        FLASH_DECODE.register(_variant)

OP = FLASH_DECODE

__all__ = ["FLASH_DECODE", "OP", "FlashDecode", "global_lengths", "shard_lengths"]
