"""The Triton kernels compile for an H100/H200 (sm_90) on a machine without a GPU.

The interpreter (the CPU tests) runs kernels as Python and accepts code that Triton's compiler rejects
(e.g. a `None` flowing into arithmetic in a branch the compiler still builds), so this compiles them to a
cubin: Triton ships its own ptxas, no driver is needed. It runs in a subprocess because the test session
may have set ``TRITON_INTERPRET=1``, under which ``triton.jit`` makes interpreted functions only.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

COMPILE_ALIAS_FREE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from rewrite.kernels.alias_free import snake as triton_alias_free

pointers = ("x_ptr", "x_bias_ptr", "alpha_ptr", "beta_ptr", "taps_ptr", "out_ptr")
ints = ("rows", "channels", "T", "t_blocks", "x_row_stride", "out_row_stride", "out_offset", "limit_ptr", "limit_scale",
        "limit_extra")
flags = ("LOGSCALE", "HAS_X_BIAS", "BLOCK_R", "BLOCK_T", "HALO_T", "ZEROS_BLOCK", "OUT_CHANNELS_LAST", "ROUND_TF32")
for dtype, has_bias, zeros, last in (("fp32", True, 16, True), ("fp32", False, 0, False), ("bf16", False, 0, False),
                                     ("fp16", True, 0, True)):
    signature = {**{p: "*" + dtype for p in pointers}, **{i: "i32" for i in ints}, **{f: "constexpr" for f in flags}}
    signature["limit_ptr"] = "*i32"
    constants = {"LOGSCALE": True, "HAS_X_BIAS": has_bias, "BLOCK_R": 4, "BLOCK_T": 64, "HALO_T": 8, "ZEROS_BLOCK": zeros,
                 "OUT_CHANNELS_LAST": last, "ROUND_TF32": last and dtype == "fp32"}
    kernel = triton.compile(ASTSource(triton_alias_free._alias_free_snake_kernel, signature, constexprs=constants),
                            target=GPUTarget("cuda", 90, 32))
    assert kernel.asm["cubin"], (dtype, has_bias, zeros, last)
print("compiled")
"""

COMPILE_CONV = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from rewrite.kernels.conv1d import conv1d as triton_conv1d

pointers = ("x_ptr", "w_ptr", "bias_ptr", "res_ptr", "out_ptr")
ints = ("C", "O", "T", "dilation", "c_blocks", "ksize", "splits", "split_iters", "x_batch_stride", "w_out_stride",
        "w_in_stride", "w_tap_stride", "res_batch_stride", "res_row_stride", "out_batch_stride", "out_row_stride",
        "out_split_stride", "limit_ptr", "limit_scale", "limit_extra")
flags = ("HAS_BIAS", "HAS_RES", "PRECISION", "BLOCK_O", "BLOCK_T", "BLOCK_C")
for (block_o, block_t, block_c, warps, stages) in (config.tile for config in triton_conv1d._CONFIGS):
    for dtype, precision in (("fp32", "tf32"), ("bf16", "ieee")):
        signature = {**{p: "*" + dtype for p in pointers}, **{i: "i32" for i in ints}, **{f: "constexpr" for f in flags}}
        signature["limit_ptr"] = "*i32"
        constants = {"HAS_BIAS": True, "HAS_RES": dtype == "fp32", "PRECISION": precision,
                     "BLOCK_O": block_o, "BLOCK_T": block_t, "BLOCK_C": block_c}
        kernel = triton.compile(ASTSource(triton_conv1d._conv1d_kernel, signature, constexprs=constants),
                                target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
        assert kernel.asm["cubin"] and kernel.metadata.shared <= 227 * 1024, (block_o, block_t, block_c, dtype)
signature = {"w_ptr": "*fp32", "out_ptr": "*fp32", "C": "i32", "K": "i32", "total": "i32",
             "ROUND_TF32": "constexpr", "BLOCK": "constexpr"}
kernel = triton.compile(ASTSource(triton_conv1d._pack_kernel, signature, constexprs={"ROUND_TF32": True, "BLOCK": 1024}),
                        target=GPUTarget("cuda", 90, 32))
assert kernel.asm["cubin"]
signature = {"partial_ptr": "*fp32", "bias_ptr": "*fp32", "res_ptr": "*fp32", "out_ptr": "*fp32",
             **{i: "i32" for i in ("O", "T", "total", "splits", "res_batch_stride", "res_row_stride")},
             "HAS_BIAS": "constexpr", "HAS_RES": "constexpr", "BLOCK": "constexpr"}
kernel = triton.compile(ASTSource(triton_conv1d._sum_splits_kernel, signature,
                                  constexprs={"HAS_BIAS": True, "HAS_RES": True, "BLOCK": triton_conv1d.SUM_BLOCK}),
                        target=GPUTarget("cuda", 90, 32))
assert kernel.asm["cubin"]
print("compiled")
"""


# The Wan channels_last kernels: their launchers run on CPU tensors with `launch` replaced by a recorder,
# then each recorded launch is compiled (tensor descriptors typed from their block shapes).
COMPILE_WAN_FAST = r"""
import inspect
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import mangle_type
from rewrite.kernels.attention import attention as triton_attention
from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.kernels.conv3d import phase_weights as triton_phase_weights
from rewrite.kernels.norm import one_pass as triton_norm_fast
from rewrite.kernels.pad import causal_pad as triton_pad
from rewrite.kernels.conv3d.conv3d import ConvTile
from rewrite.kernels.winograd import fused as winograd_fused
from rewrite.kernels.winograd import large_tile as winograd_large_tile
from rewrite.kernels.winograd import materialized as winograd_materialized
from rewrite.kernels.winograd import weight_points as winograd_weight_points
from rewrite.kernels.winograd import winograd

launches = []
for module in (triton_attention, triton_conv3d, triton_norm_fast, triton_pad, triton_phase_weights,
               winograd_fused, winograd_materialized, winograd_large_tile, winograd_weight_points):
    module.launch = lambda kernel, grid, *args, **kwargs: launches.append((kernel, args, kwargs))
CL = torch.channels_last_3d
BF16 = torch.bfloat16

def conv(cin, cout, h, w, tile, epilogue):
    padded = torch.zeros(1, cin, 4, h + 2, w + 2, dtype=BF16).contiguous(memory_format=CL)
    weight = torch.zeros(cout, cin, 3, 3, 3, dtype=BF16).contiguous(memory_format=CL)
    bias = torch.zeros(cout, dtype=BF16)
    if epilogue in ("norm", "chain"):  # chain: a residual read, the output stored, then normalized
        nxt = torch.zeros(1, cout, 4, h + 2, w + 2, dtype=BF16).contiguous(memory_format=CL)
        cache = torch.zeros(1, cout, 2, h, w, dtype=BF16).contiguous(memory_format=CL)
        out = torch.zeros(1, cout, 2, h, w, dtype=BF16) if epilogue == "chain" else None
        triton_conv3d.conv3d_channels_last_norm_padded(padded, weight, bias, torch.ones(cout, dtype=BF16), 1.0, 0.0,
                                                       1e-12, True, nxt, cache, [1, 1, 1, 1, 0, 0], 2, config=tile,
                                                       residual=None if out is None else out.clone(), out=out)
    else:
        out = torch.zeros(1, cout, 2, h, w, dtype=BF16)
        triton_conv3d.conv3d_channels_last(padded, weight, bias, out.clone(), out, config=tile)

conv(96, 96, 6, 1280, ConvTile(256, 64, 32, 8, 4, 32), "ncdhw+residual")
conv(96, 96, 6, 832, ConvTile(64, 64, 32, 4, 3, 32, 2, max_registers=128), "norm")
conv(192, 192, 6, 640, ConvTile(128, 128, 64, 8, 3, 64, max_registers=128), "norm")
conv(96, 96, 6, 1280, ConvTile(256, 64, 32, 8, 4, 32, max_registers=128), "chain")
conv(192, 192, 6, 640, ConvTile(128, 128, 64, 8, 3, 64, max_registers=128), "chain")
conv(384, 384, 6, 320, ConvTile(64, 128, 64, 4, 4, 0, 2), "ncdhw+residual")
conv(192, 192, 6, 416, ConvTile(128, 128, 64, 8, 3, 64, max_registers=128, flat=True), "norm")  # flat programs
conv(192, 192, 6, 416, ConvTile(128, 128, 64, 8, 3, 64, max_registers=128, flat=True), "chain")
conv(384, 384, 6, 208, ConvTile(128, 128, 64, 4, 4, flat=True), "ncdhw+residual")
x = torch.zeros(1, 96, 2, 4, 8, dtype=BF16)
triton_norm_fast.rms_norm_padded_one_pass(x, torch.ones(96, dtype=BF16), 1.0, 0.0, 1e-12, True,
                                          torch.zeros(1, 96, 2, 4, 8, dtype=BF16), [1, 1, 1, 1, 0, 0])
q, k, v = torch.zeros(1, 1, 300, 3 * 384, dtype=BF16).chunk(3, dim=-1)  # Wan 2.1's middle-block attention
triton_attention.attention(q, k, v)
triton_phase_weights.phase_weights(torch.zeros(192, 384, 3, 3, dtype=BF16))  # an upsampler's phase kernels
for dtype, tile in ((BF16, winograd.WinogradTile()), (torch.float16, winograd.WinogradTile(64, 64, 32, 8, 2)),
                    (BF16, winograd.WinogradTile(64, 128, 64, 8, 3, materialized=True)),
                    (BF16, winograd.WinogradTile(128, 128, 64, 8, 3, materialized=True, one_loop=True)),
                    (BF16, winograd.WinogradTile(128, 256, 64, 8, 3, materialized=True, split_output=True)),
                    (BF16, winograd.WinogradTile(128, 256, 64, 8, 3, True, 0, False, True, 4))):
    padded = torch.zeros(1, 64, 4, 6, 8, dtype=dtype).contiguous(memory_format=CL)
    winograd.winograd_conv3d(padded, torch.zeros(64, 64, 3, 3, 3, dtype=dtype), torch.zeros(64, dtype=dtype),
                             torch.zeros(1, 64, 2, 4, 6, dtype=dtype), tile)
winograd_weight_points.transformed_weight_4_into(  # both passes of F(4x4, 3x3)'s weight transform
    torch.zeros(64, 48, 3, 3, 3, dtype=BF16).contiguous(memory_format=CL), torch.zeros(36, 144, 64,
                                                                                   dtype=torch.float16),
    torch.zeros(36))

for kernel, args, kwargs in launches:
    kwargs.pop("exact", None)
    options = {key: kwargs.pop(key) for key in ("num_warps", "maxnreg", "num_stages") if key in kwargs}
    options.setdefault("num_stages", kwargs.get("STAGES", 3))
    signature = {name: mangle_type(value) for name, value in zip(inspect.signature(kernel.fn).parameters, args)}
    signature.update({name: "constexpr" for name in kwargs})
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=kwargs), target=GPUTarget("cuda", 90, 32),
                              options=options)
    assert compiled.asm["cubin"] and compiled.metadata.shared <= 227 * 1024, kwargs
print("compiled")
"""


@pytest.mark.parametrize("program", (COMPILE_ALIAS_FREE, COMPILE_CONV, COMPILE_WAN_FAST),
                         ids=("alias_free", "triton_conv1d", "wan_channels_last"))
def test_kernels_compile_for_sm90(program):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-4000:]
