"""Regimes a run or a plan belongs to, for error reporting and error bands.

A run may sit in several regimes (a torchtitan FSDP run at 8K in fp8 is dense <= 8K, FSDP/ZeRO-3
and fp8); `primary_regime` picks the most specific one for a plan's error band, in the order
moe > long context > FSDP/ZeRO-3 > fp8 > dense.
"""

from __future__ import annotations

REGIMES: tuple[str, ...] = ("dense<=8k", "long-context>=32k", "fsdp-zero3", "moe", "fp8")
_PRIORITY = ("moe", "long-context>=32k", "fsdp-zero3", "fp8", "dense<=8k")
LOW_PRECISIONS = frozenset({"fp8", "mxfp8", "nvfp4", "mxfp4"})  # autopar.choices.Precision beyond bf16


def regimes_of(moe: bool, seq_len: int, zero: int | None, precision: str) -> list[str]:
    """Every regime that applies: dense <= 8K tokens, long context >= 32K, ZeRO-3/FSDP, MoE, fp8."""
    out = []
    if not moe and seq_len <= 8192:
        out.append("dense<=8k")
    if seq_len >= 32768:
        out.append("long-context>=32k")
    if zero is not None and zero >= 3:
        out.append("fsdp-zero3")
    if moe:
        out.append("moe")
    if precision in LOW_PRECISIONS:  # the block-scaled formats share fp8's band until runs of their own exist
        out.append("fp8")
    return out


def primary_regime(moe: bool, seq_len: int, zero: int | None, precision: str) -> str:
    """The most specific regime (see the module docstring); "dense<=8k" when none applies
    (a dense run between 8K and 32K tokens is closest to it)."""
    found = regimes_of(moe, seq_len, zero, precision)
    return next((r for r in _PRIORITY if r in found), "dense<=8k")
