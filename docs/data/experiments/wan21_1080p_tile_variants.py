"""Probe (session 29, issue 37 item 4): Wan 2.1 `channels_last` at 1088x1920 with and without the H100 sweep's
tiles (`conv3d.CARD_TILES`; docs/data/sweeps/conv3d_wan21_1080_h100_bf16.json), one variant per process, against
`off`.

    python wan21_1080p_tile_variants.py VARIANT FRAMES OUT.json
    VARIANT: off | rule (`launch_config`'s tiles only: CARD_TILES emptied) | current (CARD_TILES as committed in
    session 29; since session 30 `CARD_CUDNN_FASTER` is emptied for it) | cudnn192 (current, and cuDNN for the
    192-channel convs 960 wide: what session 30 made the H100's choice)
"""
import json
import sys
import time

import torch

from rewrite import optimize, supported
from rewrite.kernels.conv3d import conv3d

variant, frames, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
original_chosen = conv3d.chosen


def chosen(in_channels, out_channels, taps, width=None, device=None):
    if width == 960 and out_channels == 192:
        return False
    return original_chosen(in_channels, out_channels, taps, width, device)


if variant == "rule":
    conv3d.CARD_TILES.clear()
if variant == "current":  # as before session 30's per-card choices (the H100's 192 at 960 then on cuDNN)
    conv3d.CARD_CUDNN_FASTER.clear()
if variant == "cudnn192":
    conv3d.chosen = chosen
vae = supported.get("wan2.1").build("full", device="cuda", dtype=torch.bfloat16)
z = torch.randn(1, 16, (frames - 1) // 4 + 1, 1088 // 8, 1920 // 8,
                generator=torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
optimize(vae, level="off" if variant == "off" else "channels_last")
times = []
with torch.no_grad():
    for i in range(4):
        torch.cuda.synchronize()
        start = time.perf_counter()
        video = vae.decode(z).sample
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
if variant != "off":
    optimize(vae, level="off")
    with torch.no_grad():
        reference = vae.decode(z).sample
    err = (video.float() - reference.float()).abs().max().item()
else:
    err = 0.0
result = {"variant": variant, "frames": frames, "gpu": torch.cuda.get_device_name(), "times_s": times,
          "best_s": min(times[1:]), "max_abs_vs_off": err, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
json.dump(result, open(out_path, "w"), indent=1)
print(json.dumps(result))
