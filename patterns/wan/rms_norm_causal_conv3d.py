"""A Wan RMS norm (+ SiLU) feeding a causal conv3d (the `norm -> silu -> conv` of every residual block).

Matches:  rewrite::causal_conv3d(rewrite::rms_norm(x, gamma, scale, norm_bias, eps, upcast, act),
                                 cache, pad, mode, weight, bias, residual)
          (after `rms_norm` and `causal_conv3d` matched; the norm's output has no other user: the next cache
          is taken inside the conv op; bias, residual and cache each present or absent)
Replaces: rewrite::rms_norm_causal_conv3d(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode,
                                          weight, bias, residual, None, None, False) -> (output, next cache)
Exactness: exact. The norm kernel's values (ATen's summation order, the same epilogue) are stored straight
          into the padded channels-last conv input and the next cache instead of a tensor the pad kernel
          would copy from; the rest is `causal_conv3d`'s. Where a piece is not proven for the input, the two
          replaced ops run.
Level: lossless.
Guard: x is 5-D.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan.ops import ConvStage  # (importing it registers torch.ops.rewrite.*)

rewrite_ops = torch.ops.rewrite


def search(x, stage: ConvStage, residual):
    normalized = rewrite_ops.rms_norm.default(x, stage.gamma, stage.scale, stage.norm_bias, stage.eps, stage.upcast,
                                              stage.act)
    out = rewrite_ops.causal_conv3d.default(normalized, stage.cache, stage.pad, stage.mode, stage.weight, stage.bias,
                                            residual)
    return out[0], out[1]


def replace(x, stage: ConvStage, residual):
    out = rewrite_ops.rms_norm_causal_conv3d.default(x, *stage, residual, None, None, False)
    return out[0], out[1]  # every argument spelled out: the deferred-bias patterns match on them


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    return None if x.dim() == 5 else f"x is {x.dim()}-D, expected [b, c, t, h, w]"


PATTERNS = variants(search, replace, guard, name="rms_norm_causal_conv3d", exactness="exact", level="lossless",
                    optional=("residual", "bias", "cache"), module_types=("WanResidualBlock", "WanCausalConv3d"))
