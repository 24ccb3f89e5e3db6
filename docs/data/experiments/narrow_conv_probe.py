"""Probe (session 30, issue 39): the encoders' first conv (3 video channels; Wan 2.2's 12 after the patchify) as
`rewrite::causal_conv3d_fast` (input widened with zeros to 16 channels, the Triton conv; "folded": the kernel's
columns folded into those channels where 3 x C fit, else "widened") against the ``lossless`` op
`rewrite::causal_conv3d` (cuDNN), one 4-frame steady step with its 2 cache frames, bf16; ms per call (median,
`triton.testing.do_bench`), the max-abs between the two, and the pad kernels alone. Session 30's
`narrow_conv_probe_h100.json` was taken with this script as of 504cdad (before the folded form), with a
CUDA-event median of 20 calls after 5 warm-up calls.

    python narrow_conv_probe.py OUT.json
"""
import json
import sys

import torch
import triton.testing

from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.kernels.pad import causal_pad as triton_pad
from rewrite.models.wan import causal_conv_fast  # registers rewrite::causal_conv3d_fast

SHAPES = {"wan2.1 3->96 @ 4x720x1280": (3, 96, 720, 1280), "wan2.1 3->96 @ 4x480x832": (3, 96, 480, 832),
          "wan2.2 12->160 @ 4x352x640": (12, 160, 352, 640)}


def timed(fn):
    """Median ms of `fn` by `triton.testing.do_bench` (L2 flushed between calls)."""
    return triton.testing.do_bench(fn, return_mode="median")


def main(out_path):
    card = torch.cuda.get_device_name()
    # the probe measures every shape on the kernel path, chosen or not
    measured = triton_conv3d.CARD_FASTER_THAN_CUDNN.get(card, frozenset())
    both = frozenset({(16, o, taps, w) for _, o, _, w in SHAPES.values() for taps in (9, 27)}) | measured
    widened_only = frozenset(conv for conv in both if conv[2] != 9)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = {}
    with torch.no_grad():
        for name, (c, o, h, w) in SHAPES.items():
            x = torch.rand(1, c, 4, h, w, device="cuda", generator=g).to(torch.bfloat16) * 2 - 1
            cache = torch.rand(1, c, 2, h, w, device="cuda", generator=g).to(torch.bfloat16) * 2 - 1
            weight = (torch.randn(o, c, 3, 3, 3, device="cuda", generator=g) / (27 * c) ** 0.5).to(torch.bfloat16)
            bias = torch.randn(o, device="cuda", generator=g).to(torch.bfloat16)
            pad = [1, 1, 1, 1, 0, 0]
            args = (x, cache, pad, "steady", weight, bias, None)
            triton_conv3d.CARD_FASTER_THAN_CUDNN[card] = widened_only
            widened = timed(lambda: torch.ops.rewrite.causal_conv3d_fast(*args))
            triton_conv3d.CARD_FASTER_THAN_CUDNN[card] = both
            fast = torch.ops.rewrite.causal_conv3d_fast(*args)
            exact = torch.ops.rewrite.causal_conv3d(*args)
            rows[name] = {
                "form": causal_conv_fast.plan((1, c, 6, h + 2, w + 2), tuple(weight.shape), x.dtype, x.device)[0],
                "lossless_op_ms": timed(lambda: torch.ops.rewrite.causal_conv3d(*args)),
                "fast_op_ms": timed(lambda: torch.ops.rewrite.causal_conv3d_fast(*args)),
                "widened_form_op_ms": widened,
                "folded_pad_ms": (timed(lambda: triton_pad.causal_pad_channels_last_folded(x, cache, pad, 3, 16))
                                  if 3 * c <= 16 else None),
                "widened_pad_ms": timed(lambda: triton_pad.causal_pad_channels_last(x, cache, pad, 16)),
                "narrow_pad_ms": timed(lambda: triton_pad.causal_pad_channels_last(x, cache, pad)),
                "max_abs_vs_lossless": (fast[0].float() - exact[0].float()).abs().max().item(),
                "next_cache_equal": torch.equal(fast[1], exact[1]),
                "output_strides_equal": fast[0].stride() == exact[0].stride(),
            }
            print(name, json.dumps(rows[name]))
    with open(out_path, "w") as f:
        json.dump({"gpu": card, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
