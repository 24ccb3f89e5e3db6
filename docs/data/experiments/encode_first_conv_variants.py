"""Probe (session 30, issue 39): a Wan encode at `channels_last` with and without the card's own encoder entries
(`conv3d.CARD_FASTER_THAN_CUDNN`: the widened first conv, 96 -> 192, Wan 2.2's 320 -> 640 and 640), one variant per
process, against `off`; for a card whose table lacks them ("added" copies the H100's entries to the running card).

    python encode_first_conv_variants.py VARIANT MODEL HEIGHTxWIDTH FRAMES OUT.json
    VARIANT: off | lossless | current (the tables as committed) | none (the card's encoder entries removed) |
    added (the H100's entries and flat tiles given to this card)
"""
import json
import sys
import time

import torch

from rewrite import optimize, supported
from rewrite.kernels.conv3d import conv3d

variant, model, size, frames, out_path = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
height, width = map(int, size.split("x"))
card = torch.cuda.get_device_name()
h100 = "NVIDIA H100 80GB HBM3"
if variant == "none":
    conv3d.CARD_FASTER_THAN_CUDNN.pop(card, None)
if variant == "added":
    conv3d.CARD_FASTER_THAN_CUDNN[card] = conv3d.CARD_FASTER_THAN_CUDNN[h100]
    conv3d.CARD_TILES.setdefault(card, {}).update(
        {k: v for k, v in conv3d.CARD_TILES[h100].items() if k in ((320, 640, 160), (640, 640, 160))})
vae = supported.get(model).build("full", device="cuda", dtype=torch.bfloat16)
video = (torch.rand(1, 3, frames, height, width, generator=torch.Generator().manual_seed(0)) * 2 - 1).to(
    "cuda", torch.bfloat16)
optimize(vae, level="off" if variant == "off" else "lossless" if variant == "lossless" else "channels_last")
times = []
with torch.no_grad():
    for _ in range(4):
        torch.cuda.synchronize()
        start = time.perf_counter()
        latents = vae.encode(video).latent_dist.mean
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if variant != "off":
        optimize(vae, level="off")
        reference = vae.encode(video).latent_dist.mean
        err = (latents.float() - reference.float()).abs().max().item()
    else:
        err = 0.0
result = {"variant": variant, "model": model, "size": size, "frames": frames, "gpu": card, "times_s": times,
          "best_s": min(times[1:]), "max_abs_mean_vs_off": err, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
json.dump(result, open(out_path, "w"), indent=1)
print(json.dumps(result))
