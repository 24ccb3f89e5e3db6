"""Inputs for every custom op of the `rewrite` namespace, in the layouts each op is given and returns.

`CASES[op]` is a list of `Case`s for the op named ``rewrite::<op>``: contiguous, frame-major ([b, t, c, h, w]
memory, what the Wan up blocks' 2-D upsampler convs leave) and channels-last inputs, the optional arguments
present and absent, each cache mode. Small shapes (the Triton interpreter runs the kernel paths on CPU).
`kernel_gates_open` opens the GPU-only gates of the kernel paths for a CPU run (the conv and SiLU self-checks,
the norm plan that needs CUDA's launch limits), so that those paths run under the interpreter.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Optional

import torch

from rewrite.models.auk.model import AliasFreeSnakeBeta
from rewrite.ops import selftest
from rewrite.kernels.norm import aten_reduction
from rewrite.kernels import layout
from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.models.wan import ops_fast as wan_fast
from rewrite.models.wan import upsample_fast as wan_upsample_fast
from rewrite.models.wan import attention_fast as _attention_ops  # noqa: F401  (registers rewrite::attention_fast)
from rewrite.models.wan import downsample as _downsample_ops  # noqa: F401  (registers pad_conv2d, time_conv)
from rewrite.models.wan import causal_conv_fast as _narrow_conv_ops  # noqa: F401  (registers causal_conv3d_fast)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    args: tuple
    weight: Optional[int] = None  # position of the conv weight among the arguments


def frame_major(t: torch.Tensor) -> torch.Tensor:
    return t.permute(0, 2, 1, 3, 4).contiguous().permute(0, 2, 1, 3, 4)


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last_3d if t.dim() == 5 else torch.channels_last)


LAYOUTS = {"contiguous": lambda t: t, "frame_major": frame_major, "channels_last": channels_last}


def norm_plan_on_cpu(x, upcast, reference_contiguous=False, rows=None):
    """`layout.norm_plan`'s layout conditions without its CUDA ones (2 threads, one block)."""
    x5 = layout.as5d(x)
    fits = layout.run_stride(x5) is not None if reference_contiguous else layout.planes_contiguous(x5)
    return aten_reduction.NormPlan(split=2, vec=1, ctas=1) if fits and (x.dtype != torch.float32) == upcast else None


def kernel_gates_open(monkeypatch) -> None:
    monkeypatch.setattr(triton_conv3d, "_FASTER_THAN_CUDNN", {(16, 16, 27): math.inf})  # the fast op's cases
    monkeypatch.setattr(triton_conv3d, "_NORM_EPILOGUE_FASTER", frozenset({(16, 16)}))  # the pair op's
    monkeypatch.setattr(wan_fast, "_RESIDUAL_NORM_EPILOGUE_FASTER", frozenset({(16, 16)}))  # the chain op's
    monkeypatch.setattr(wan_upsample_fast, "_TRITON_PHASES_FASTER", frozenset({(16, 16)}))  # the upsample conv's
    monkeypatch.setattr(wan_upsample_fast, "_CUDNN_PHASES_FASTER", {(16, 16): 1})  # the up-block end's
    monkeypatch.setattr(triton_conv3d, "launch_config", lambda c, o, w=None, *_, **__: triton_conv3d.ConvTile(32, 16, 16, 4, 1))
    monkeypatch.setattr(selftest, "channels_last_conv_is_exact", lambda *args, **kwargs: True)
    monkeypatch.setattr(selftest, "strided_channels_last_conv_is_exact", lambda *args, **kwargs: True)
    monkeypatch.setattr(selftest, "silu_is_exact", lambda *args, **kwargs: True)
    monkeypatch.setattr(layout, "norm_plan", norm_plan_on_cpu)


def _cases() -> dict[str, list[Case]]:
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype=torch.float32, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(dtype)

    cases: dict[str, list[Case]] = {}

    def add(op, case_id, *args, weight=None):
        cases.setdefault(op, []).append(Case(case_id, args, weight))

    c, co, h, w = 4, 6, 3, 4
    # ---- rms_norm: 5-D and 4-D, every layout, SiLU or not, fp32 and the bf16 upcast
    for lay, act in itertools.product(LAYOUTS, ("silu", None)):
        add("rms_norm", f"{lay}_{act}", LAYOUTS[lay](rnd(1, c, 2, h, w)), rnd(c, 1, 1, 1), 2.0, 0.0, 1e-12, False, act)
    add("rms_norm", "frame_major_bf16", frame_major(rnd(2, c, 2, h, w, dtype=torch.bfloat16)),
        rnd(c, 1, 1, 1, dtype=torch.bfloat16), 2.0, 0.0, 1e-12, True, "silu")
    for lay in ("contiguous", "channels_last"):
        add("rms_norm", f"4d_{lay}", LAYOUTS[lay](rnd(2, c, h, w)), rnd(c, 1, 1), 2.0, 0.0, 1e-12, False, None)

    # ---- the causal convs: every cache mode, x and cache layouts, with and without the optional tensors
    pad = [1, 1, 1, 1, 2, 0]
    modes = (("steady_t1", 1, "contiguous"), ("steady_t1", 1, "channels_last"), ("steady", 3, "contiguous"),
             ("chunk0", 1, None))
    for (mode, frames, cache_layout), lay in itertools.product(modes, ("contiguous", "frame_major")):
        x = LAYOUTS[lay](rnd(1, c, frames, h, w))
        cache = None if cache_layout is None else LAYOUTS[cache_layout](rnd(1, c, 2, h, w))
        tag = f"{mode}_x_{lay}_cache_{cache_layout}"
        add("causal_conv_input", tag, x, cache, pad, mode)
        out_frames = frames + (0 if mode == "chunk0" else 2)
        weight = rnd(co, c, 3, 3, 3, scale=0.2)
        for res_layout, bias in itertools.product((None, "contiguous", "frame_major"), (True, False)):
            residual = None if res_layout is None else LAYOUTS[res_layout](rnd(1, co, out_frames, h, w))
            add("causal_conv3d", f"{tag}_residual_{res_layout}_bias_{bias}", x, cache, pad, mode, weight,
                rnd(co) if bias else None, residual, weight=4)
        square = rnd(c, c, 3, 3, 3, scale=0.2)
        gamma = rnd(c, 1, 1, 1)
        norm = (gamma, 2.0, 0.0, 1e-12, False, "silu", cache, pad, mode, square)
        for res_layout, residual_bias in ((None, False), ("contiguous", False), ("frame_major", False),
                                          ("frame_major", True), ("contiguous", True)):
            residual = None if res_layout is None else LAYOUTS[res_layout](rnd(1, c, out_frames, h, w))
            add("rms_norm_causal_conv3d", f"{tag}_residual_{res_layout}_deferred_{residual_bias}", x, *norm, rnd(c),
                residual, None, rnd(c) if residual_bias else None, False, weight=10)
        # x a channels-last conv output whose bias was deferred; the raw channels-last output for the next op
        add("rms_norm_causal_conv3d", f"{tag}_x_bias", channels_last(x), *norm, rnd(c), None, rnd(c), None, False,
            weight=10)
        add("rms_norm_causal_conv3d", f"{tag}_channels_last_out", x, *norm, None, None, None, None, True, weight=10)
    add("causal_conv_input", "chunk0_x_channels_last", channels_last(rnd(1, c, 1, h, w)), None, pad, "chunk0")
    # the band graphs' form (`rewrite.models.wan.distributed.band_graphs`): x and cache carry halo rows, no row pad
    band_pad = [1, 1, 0, 0, 2, 0]
    for mode, frames in (("steady_t1", 1), ("chunk0", 1)):
        x, cache = rnd(1, c, frames, h + 2, w), None if mode == "chunk0" else rnd(1, c, 2, h + 2, w)
        add("causal_conv_input", f"band_{mode}", x, cache, band_pad, mode)
        add("causal_conv3d", f"band_{mode}", x, cache, band_pad, mode, rnd(co, c, 3, 3, 3, scale=0.2), rnd(co),
            rnd(1, co, frames + (0 if mode == "chunk0" else 2), h, w), weight=4)
        norm = (rnd(c, 1, 1, 1), 2.0, 0.0, 1e-12, False, "silu", cache, band_pad, mode, rnd(c, c, 3, 3, 3, scale=0.2))
        add("rms_norm_causal_conv3d", f"band_{mode}_whole_order", x, *norm, rnd(c), None, None, None, False, 2 * h,
            weight=10)

    # ---- the channels_last twin: bf16 and 16 channels, a shape `kernel_gates_open` lets the Triton conv serve
    bf = torch.bfloat16
    for mode, frames, lay in (("steady_t1", 1, "contiguous"), ("steady", 2, "frame_major"), ("chunk0", 1, "contiguous")):
        cache = None if mode == "chunk0" else rnd(1, 16, 2, h, 5, dtype=bf)
        twin_pad = [1, 1, 1, 1, 2, 0] if mode == "chunk0" else [1, 1, 1, 1, 0, 0]
        x = LAYOUTS[lay](rnd(1, 16, frames, h, 5, dtype=bf))
        norm = (rnd(16, 1, 1, 1, dtype=bf), 4.0, 0.0, 1e-12, True, "silu", cache, twin_pad, mode,
                rnd(16, 16, 3, 3, 3, dtype=bf, scale=0.1))
        for res_layout, residual_bias in ((None, False), ("contiguous", False), ("frame_major", True)):
            residual = None if res_layout is None else LAYOUTS[res_layout](rnd(1, 16, frames, h, 5, dtype=bf))
            add("rms_norm_causal_conv3d_fast", f"{mode}_x_{lay}_residual_{res_layout}_deferred_{residual_bias}", x,
                *norm, rnd(16, dtype=bf), residual, None, rnd(16, dtype=bf) if residual_bias else None, False, weight=10)
        add("rms_norm_causal_conv3d_fast", f"{mode}_x_bias", channels_last(x), *norm, rnd(16, dtype=bf), None,
            rnd(16, dtype=bf), None, False, weight=10)
        add("rms_norm_causal_conv3d_fast", f"{mode}_channels_last_out", x, *norm, None, None, None, None, True,
            weight=10)
        # the narrow-input conv (the encoder's first: 3 channels widened to 16)
        narrow = LAYOUTS[lay](rnd(1, 3, frames, h, 5, dtype=bf))
        narrow_cache = None if cache is None else rnd(1, 3, 2, h, 5, dtype=bf)
        for residual in (None, LAYOUTS[lay](rnd(1, 16, frames, h, 5, dtype=bf))):
            add("causal_conv3d_fast", f"{mode}_x_{lay}_residual_{residual is not None}", narrow, narrow_cache, twin_pad,
                mode, rnd(16, 3, 3, 3, 3, dtype=bf, scale=0.2), rnd(16, dtype=bf), residual, weight=4)
        # the pair: the block's two convs, the second norm in the first conv's epilogue
        cache2 = None if mode == "chunk0" else rnd(1, 16, 2, h, 5, dtype=bf)
        second = (rnd(16, 1, 1, 1, dtype=bf), 4.0, 0.0, 1e-12, True, "silu", cache2, twin_pad, mode,
                  rnd(16, 16, 3, 3, 3, dtype=bf, scale=0.1), rnd(16, dtype=bf))
        for res_layout, residual_bias in ((None, False), ("frame_major", True)):
            residual = None if res_layout is None else LAYOUTS[res_layout](rnd(1, 16, frames, h, 5, dtype=bf))
            add("rms_norm_causal_conv3d_pair_fast", f"{mode}_x_{lay}_residual_{res_layout}_deferred_{residual_bias}",
                x, *norm, rnd(16, dtype=bf), *second, residual, rnd(16, dtype=bf) if residual_bias else None,
                weight=10)
        # the chain: the pair linked to the blocks around it (8 wide: rows TMA can store, the fused epilogue)
        for width in (5, 8):
            xw = LAYOUTS[lay](rnd(1, 16, frames, h, width, dtype=bf))
            cache_w = None if mode == "chunk0" else rnd(1, 16, 2, h, width, dtype=bf)
            norm_w = (*norm[:6], cache_w, *norm[7:])
            second_w = (*second[:6], None if mode == "chunk0" else rnd(1, 16, 2, h, width, dtype=bf), *second[7:])
            third = (rnd(16, 1, 1, 1, dtype=bf), 4.0, 0.0, 1e-12, True, "silu",
                     None if mode == "chunk0" else rnd(1, 16, 2, h, width, dtype=bf), twin_pad, mode)
            padded = channels_last(rnd(1, 16, frames + 2, h + 2, width + 2, dtype=bf))
            for linked_in, linked_out in itertools.product((False, True), (False, True)):
                residual = LAYOUTS["frame_major" if linked_out else "contiguous"](rnd(1, 16, frames, h, width, dtype=bf))
                nxt = third if linked_out else (None, 1.0, 0.0, 0.0, False, None, None, [0] * 6, "steady")
                add("rms_norm_causal_conv3d_pair_fast_chain", f"{mode}_w{width}_in_{linked_in}_out_{linked_out}", xw,
                    padded if linked_in else None, *norm_w[:6], None if linked_in else cache_w, *norm_w[7:],
                    rnd(16, dtype=bf), *second_w, residual, None, *nxt, weight=11)

    for res_layout, bias in itertools.product(LAYOUTS, (True, False)):
        add("conv3d_residual", f"residual_{res_layout}_bias_{bias}", rnd(1, c, 3, h + 2, w + 2),
            rnd(co, c, 3, 3, 3, scale=0.2), rnd(co) if bias else None,
            LAYOUTS[res_layout](rnd(1, co, 1, h, w)), weight=1)
    for lay, bias in itertools.product(LAYOUTS, (True, False)):
        add("pointwise_conv3d", f"{lay}_bias_{bias}", LAYOUTS[lay](rnd(1, c, 2, h, w)), rnd(co, c, 1, 1, 1),
            rnd(co) if bias else None, weight=1)
    for lay in ("contiguous", "frame_major"):
        add("temporal_interleave", lay, LAYOUTS[lay](rnd(1, 2 * c, 2, h, w)))

    # ---- the 2-D upsample (+ conv): NCHW, NHWC and the frames of an NCDHW tensor (the steady graph's view)
    planes = {"contiguous": rnd(2, c, h, w), "channels_last": channels_last(rnd(2, c, h, w)),
              "frames_of_ncdhw": rnd(c, 2, h, w).transpose(0, 1)}
    for (lay, x), upcast in itertools.product(planes.items(), (False, True)):
        x = x.to(torch.bfloat16) if upcast else x
        add("upsample_nearest2x", f"{lay}_upcast_{upcast}", x, upcast)
        for bias in (True, False):
            add("upsample_conv2d", f"{lay}_upcast_{upcast}_bias_{bias}", x, upcast,
                rnd(co, c, 3, 3, scale=0.2, dtype=x.dtype), rnd(co, dtype=x.dtype) if bias else None, [1, 1], [1, 1],
                weight=2)

    # ---- the encoder's downsamplers: the spatial pad + stride-2 conv over planes, the temporal conv of a steady step
    for (lay, x), bias in itertools.product(planes.items(), (True, False)):
        add("pad_conv2d", f"{lay}_bias_{bias}", x, [0, 1, 0, 1], rnd(co, c, 3, 3, scale=0.2), rnd(co) if bias else None,
            [2, 2], weight=2)
    for lay, bias in itertools.product(("contiguous", "frame_major"), (True, False)):
        add("time_conv", f"{lay}_bias_{bias}", LAYOUTS[lay](rnd(1, c, 4, h, w)), rnd(1, c, 1, h, w), [0] * 6,
            rnd(c, c, 3, 1, 1, scale=0.2), rnd(c) if bias else None, [2, 1, 1], weight=3)

    # Wan 2.2's AvgDown3D shortcut and the down block's add: spatial (group 2), spatio-temporal with chunk 0's pad
    for (ft, pad_t, frames), x_layout, main_layout in itertools.product(((1, 0, 2), (2, 0, 4), (2, 1, 1)),
                                                                        ("contiguous", "frame_major"),
                                                                        ("contiguous", "frame_major")):
        t_out, group = (frames + pad_t) // ft, ft * 2 * 2 * c // 8
        x = LAYOUTS[x_layout](rnd(1, c, frames, 6, 8))
        main = LAYOUTS[main_layout](rnd(1, 8, t_out, 3, 4))
        unfold, channels = [1, c, t_out, ft, 3, 2, 4, 2], [1, c * ft * 4, t_out, 3, 4]
        add("avg_down_add", f"ft_{ft}_pad_{pad_t}_x_{x_layout}_main_{main_layout}", main, x, [0, 0, 0, 0, pad_t, 0],
            unfold, channels, [1, 8, group, t_out, 3, 4])

    # the channels_last level's upsample conv by phases: bf16, 16 channels (the kernel's multiple) in and out
    planes16 = {"contiguous": rnd(2, 16, h, w, dtype=torch.bfloat16),
                "channels_last": channels_last(rnd(2, 16, h, w, dtype=torch.bfloat16)),
                "frames_of_ncdhw": rnd(16, 2, h, w, dtype=torch.bfloat16).transpose(0, 1)}
    for (lay, x), bias in itertools.product(planes16.items(), (True, False)):
        add("upsample_conv2d_fast", f"{lay}_bias_{bias}", x, True, rnd(16, 16, 3, 3, scale=0.2, dtype=x.dtype),
            rnd(16, dtype=x.dtype) if bias else None, [1, 1], [1, 1], weight=2)

    # ---- Wan 2.2's DupUp3D shortcut: alone, and in the upsample conv's epilogue
    cin, cout, ft, fs, t = 8, 4, 2, 2, 2
    for first, dx_layout in itertools.product((0, 1), ("contiguous", "frame_major")):
        unfold, fold = [1, cout, ft, fs, fs, t, h, w], [1, cout, t * ft, h * fs, w * fs]
        repeats, frames = cout * ft * fs * fs // cin, t * ft - first
        dx = LAYOUTS[dx_layout](rnd(1, cin, t, h, w))
        main = rnd(1, frames, cout, h * fs, w * fs).permute(0, 2, 1, 3, 4)
        for main_layout, m in (("frame_major", main), ("contiguous", main.contiguous())):
            add("dup_up_add", f"first_{first}_dx_{dx_layout}_main_{main_layout}", m, dx, repeats, unfold, fold, first)
        x = rnd(cin, frames, h * fs // 2, w * fs // 2).transpose(0, 1)
        for bias in (True, False):
            add("upsample_conv2d_dup_up_add", f"first_{first}_dx_{dx_layout}_bias_{bias}", x, False,
                rnd(cout, cin, 3, 3, scale=0.2), rnd(cout) if bias else None, [1, 1], [1, 1],
                [1, frames, cout, h * fs, w * fs], dx, repeats, unfold, fold, first, weight=2)
    # the channels_last level's up-block end by phases: bf16, 16 channels in and out
    cin = cout = 16
    for first, dx_layout, x_layout in itertools.product((0, 1), ("contiguous", "frame_major"),
                                                        ("frames_of_ncdhw", "channels_last")):
        unfold, fold = [1, cout, ft, fs, fs, t, h, w], [1, cout, t * ft, h * fs, w * fs]
        repeats, frames = cout * ft * fs * fs // cin, t * ft - first
        dx = LAYOUTS[dx_layout](rnd(1, cin, t, h, w, dtype=torch.bfloat16))
        x = rnd(cin, frames, h * fs // 2, w * fs // 2, dtype=torch.bfloat16).transpose(0, 1)
        x = channels_last(x) if x_layout == "channels_last" else x
        add("upsample_conv2d_dup_up_add_fast", f"first_{first}_dx_{dx_layout}_x_{x_layout}", x, False,
            rnd(cout, cin, 3, 3, scale=0.2, dtype=torch.bfloat16), rnd(cout, dtype=torch.bfloat16), [1, 1], [1, 1],
            [1, frames, cout, h * fs, w * fs], dx, repeats, unfold, fold, first, weight=2)

    # ---- the channels_last middle-block attention: q, k, v views of one projection (served: head dim 384)
    for d in (384, 64):
        q, k, v = rnd(1, 1, 24, 3 * d, dtype=torch.bfloat16).chunk(3, dim=-1)
        add("attention_fast", f"head_dim_{d}", q, k, v)

    # ---- AuK: x contiguous, a row-cropping view (the transposed conv's output) and a transposed view
    module = AliasFreeSnakeBeta(16)
    with torch.no_grad():
        module.act.alpha.normal_(0, 0.5, generator=g)
        module.act.beta.normal_(0, 0.5, generator=g)
    snake = (module.act.alpha.detach(), module.act.beta.detach(), module.taps)
    xs = {"contiguous": rnd(2, 16, 20), "cropped": rnd(2, 16, 25)[:, :, :20],
          "transposed": rnd(2, 20, 16).transpose(1, 2)}
    for lay, x in xs.items():
        for op in ("alias_free_snake", "alias_free_snake_exact", "alias_free_snake_module"):
            add(op, lay, x, *snake, True)
        weight = rnd(32, 16, 3, scale=0.15)
        for res_layout in (None, "contiguous", "cropped"):
            residual = {None: None, "contiguous": rnd(2, 32, 20), "cropped": rnd(2, 32, 23)[:, :, :20]}[res_layout]
            add("causal_conv1d", f"{lay}_residual_{res_layout}", x, weight, rnd(32), [2], residual, weight=1)
            for x_bias in (False, True):
                add("alias_free_snake_causal_conv1d", f"{lay}_residual_{res_layout}_x_bias_{x_bias}", x, *snake, True,
                    weight, rnd(32), [2], residual, rnd(16) if x_bias else None, weight=5)
        add("causal_conv_transpose1d", lay, x, rnd(16, 8, 4, scale=0.2), rnd(8), [2])
        add("amp_average", lay, x, xs["contiguous"], x, 3)
    _band_cases(add, rnd)
    return cases


class StandInNeighbour:
    """The comm of rank 0 of a 2-rank band decode without a process group (the band ops' cases, the segments'
    unit test): its neighbour below sends rows of 0.5 and holds the mirror image of this rank's band."""

    rank, world, name, _global = 0, 2, "op cases", (0, 1)

    def exchange_edges(self, first, last, what):
        return None, torch.full_like(first, 0.5)

    def gather_rows(self, x, heights, what):
        return torch.cat([x, x.flip(-2)[..., :heights[1], :]], -2)


def _band_cases(add, rnd) -> None:
    """The band ops (`rewrite.models.wan.distributed.band_ops`) on rank 0 of latent rows [(0, 3), (3, 5)]: bands at the
    latent resolution and at 2x, contiguous and frame-major."""
    from rewrite.models.wan.distributed.band_ops import BandContext
    from rewrite.models.wan.distributed.bands import BandRun

    ctx = BandContext([(0, 3), (3, 5)], 0)
    ctx.run = BandRun(StandInNeighbour(), ctx.rows)
    _BAND_CONTEXTS.append(ctx)  # the ops find contexts by id in a weak registry: keep this one alive
    for lay, scale in itertools.product(("contiguous", "frame_major"), (1, 2)):
        band = LAYOUTS[lay](rnd(1, 4, 2, 3 * scale, 5))
        add("band_halo_pack", f"{lay}_x{scale}", band)
        first, last = LAYOUTS[lay](rnd(1, 4, 2, 1, 5)), LAYOUTS[lay](rnd(1, 4, 2, 1, 5))
        add("band_halo_exchange", f"{lay}_x{scale}", first, last, ctx.id)
        add("band_halo_unpack", f"{lay}_x{scale}", band, first, last)
        add("band_gather_rows", f"{lay}_x{scale}", band, ctx.id)
        add("band_own_rows", f"{lay}_x{scale}", LAYOUTS[lay](rnd(1, 4, 2, 5 * scale, 5)), ctx.id)


_BAND_CONTEXTS: list = []
CASES = _cases()
MODES = ("band", "steady_t1", "steady", "chunk0")  # the cache modes a causal conv case's id starts with


def grid_group(op: str, case: Case) -> tuple[str, str]:
    """A case's op and cache mode ("" for ops without one): the quick run (`tests.quick`) keeps each such
    group, the whole run every case of it."""
    return op, next((mode for mode in MODES if case.id.startswith(mode)), "")
