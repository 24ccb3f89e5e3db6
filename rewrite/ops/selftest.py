"""Exhaustive self-tests that decide, per device and dtype, whether a fused formula may replace ATen's.

`silu_is_exact(device, dtype)`: the norm kernel folds SiLU into its epilogue only where the kernel's SiLU
is bit-identical to `F.silu` on the running device: for bf16 and fp16 over all 65,536 bit patterns, for
fp32 over 2**24 patterns spread over the whole range plus the special values (fp32 has too many to
enumerate on every start; the formula and libdevice `expf` are the ones ATen's CUDA kernel uses). The
result is cached per (device, dtype); it is never computed during a CUDA graph capture (the fused SiLU is
then simply not used).
"""

from __future__ import annotations

import torch

_RESULTS: dict[tuple[str, torch.dtype], bool] = {}


def _bit_patterns(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if dtype in (torch.bfloat16, torch.float16):
        return torch.arange(-(2**15), 2**15, dtype=torch.int32, device=device).to(torch.int16).view(dtype)
    step = 2**8  # every 256th fp32 bit pattern: 2**24 values across signs, exponents and mantissas
    bits = torch.arange(-(2**31), 2**31 - 1, step, dtype=torch.int64, device=device).to(torch.int32)
    return bits.view(torch.float32)


def silu_check(device: torch.device, dtype: torch.dtype) -> tuple[bool, int, int]:
    """(identical, mismatches, values tested): the kernel's SiLU against `F.silu`, compared as bits."""
    from rewrite.ops import triton_wan

    x = _bit_patterns(dtype, device)
    ours = triton_wan.silu(x)
    theirs = torch.nn.functional.silu(x)
    int_type = {2: torch.int16, 4: torch.int32}[x.element_size()]
    # NaNs may differ in payload only; any NaN equals any NaN here
    same = (ours.view(int_type) == theirs.view(int_type)) | (ours.isnan() & theirs.isnan())
    mismatches = int((~same).sum())
    return mismatches == 0, mismatches, x.numel()


def silu_is_exact(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cuda":
        return False
    key = (str(device), dtype)
    if key not in _RESULTS:
        if torch.cuda.is_current_stream_capturing():
            return False
        _RESULTS[key] = silu_check(device, dtype)[0]
    return _RESULTS[key]


def results() -> dict[str, bool]:
    """What the self-tests found so far in this process (for reports)."""
    return {f"silu {dtype} on {device}": ok for (device, dtype), ok in _RESULTS.items()}
