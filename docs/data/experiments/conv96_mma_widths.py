"""Session 22: the 96-channel conv's MMA widths measured apart (H200). One kernel (`_conv3d_kernel`), one input
(96 channels @ 4x720x1280 output, padded, channels-last), output channels and tiles varied so that the MMAs are
n32, n64, n128, 64 + 32, 128 + 64 or a 96-channel output padded to a 128 tile. TFLOP/s count the products the MMAs
compute (padding channels included: `computed`) and the useful ones (`useful`)."""
import json
import sys

import torch
import triton.testing

from rewrite.ops import compile_ahead
from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.kernels.conv3d.conv3d import ConvTile

CASES = [  # (name, out channels, tile)
    ("96 = 64 + 32 (chosen)", 96, ConvTile(256, 64, 32, 8, 4, 32, 1)),
    ("96 = 64 + 32, 3 stages", 96, ConvTile(256, 64, 32, 8, 3, 32, 1)),
    ("96 in one 128 tile", 96, ConvTile(256, 128, 32, 8, 3, 0, 1)),
    ("32 (n32)", 32, ConvTile(256, 32, 32, 8, 4, 0, 1)),
    ("64 (n64)", 64, ConvTile(256, 64, 32, 8, 4, 0, 1)),
    ("128 (n128)", 128, ConvTile(256, 128, 32, 8, 3, 0, 1)),
    ("128 (n128, 128 px, 4 warps)", 128, ConvTile(128, 128, 32, 4, 4, 0, 1)),
    ("192 = 128 + 64", 192, ConvTile(128, 128, 32, 8, 3, 64, 1)),
]
t, h, w, cin = 4, 720, 1280, 96
dtype = torch.bfloat16
cl = torch.channels_last_3d
torch.manual_seed(0)
padded = torch.randn(1, cin, t + 2, h + 2, w + 2, device="cuda", dtype=dtype).contiguous(memory_format=cl)
rows = []
runs = []
for name, cout, tile in CASES:
    weight = (torch.randn(cout, cin, 3, 3, 3, device="cuda", dtype=dtype) / (27 * cin) ** 0.5).contiguous(memory_format=cl)
    out = torch.empty(1, cout, t, h, w, device="cuda", dtype=dtype).contiguous(memory_format=cl)
    runs.append((name, cout, tile, weight, out))
with compile_ahead.compile_ahead() as ahead:
    for name, cout, tile, weight, out in runs if ahead else ():
        try:
            triton_conv3d.conv3d_channels_last(padded, weight, None, None, out, config=tile)
        except Exception:
            pass
for name, cout, tile, weight, out in runs:
    try:
        run = lambda: triton_conv3d.conv3d_channels_last(padded, weight, None, None, out, config=tile)
        run()
        err = (out.float() - torch.ops.aten.conv3d.default(padded, weight, None).float()).abs().max().item()
        ms = triton.testing.do_bench_cudagraph(run)
    except Exception as error:
        print(f"{name}: {type(error).__name__}: {str(error)[:200]}", flush=True)
        continue
    computed_n = max(tile.block_n + tile.n_rest, cout) if tile.n_rest else -(-cout // tile.block_n) * tile.block_n
    useful = 2 * cout * cin * 27 * t * h * w
    computed = 2 * computed_n * cin * 27 * t * h * w
    row = {"case": name, "out_channels": cout, "tile": list(tile), "ms": ms, "useful_tflops": useful / ms / 1e9,
           "computed_tflops": computed / ms / 1e9, "max_abs": err}
    rows.append(row)
    print(f"{name:<30} {ms:7.3f} ms  useful {row['useful_tflops']:5.0f}  computed {row['computed_tflops']:5.0f} TFLOP/s"
          f"  max-abs {err:.3g}", flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rows": rows}, open(sys.argv[1], "w"), indent=1)
