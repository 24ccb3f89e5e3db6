"""Session 27: the first GPU run of `vae.encode` through the encoder's graphs (issue 39). Full-size random-init
Wan 2.1 / 2.2 (perturbed gammas), bf16, one clip: diffusers' encode, then `lossless`; torch.equal of the posterior's
mean and logvar, best-of-3 seconds of each, peak memory of each (reset between).

    python docs/data/experiments/encode_lossless_probe.py wan2.1 480x832 81 OUT.json
"""

import json
import sys
import time

import torch

from rewrite import optimize, report
from rewrite.models.wan.config import build_wan


def timed(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return out, best


def main(version, size, frames, path):
    height, width = map(int, size.split("x"))
    vae = build_wan(version, "full").to("cuda", torch.bfloat16)
    video = torch.randn(1, 3, int(frames), height, width, device="cuda", generator=torch.Generator("cuda").manual_seed(0)).to(torch.bfloat16)
    row = {"model": version, "size": size, "frames": int(frames), "card": torch.cuda.get_device_name()}
    with torch.no_grad():
        torch.cuda.reset_peak_memory_stats()
        expected, row["off_s"] = timed(lambda: vae.encode(video).latent_dist)
        row["off_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        optimize(vae, "lossless")
        start = time.perf_counter()
        vae.encode(video)
        torch.cuda.synchronize()
        row["first_call_s"] = time.perf_counter() - start
        torch.cuda.reset_peak_memory_stats()
        actual, row["lossless_s"] = timed(lambda: vae.encode(video).latent_dist)
        row["lossless_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    row["equal"] = torch.equal(actual.mean, expected.mean) and torch.equal(actual.logvar, expected.logvar)
    row["speedup"] = row["off_s"] / row["lossless_s"]
    row["path"] = report(vae).last_path
    row["graph_memory"] = str(report(vae).graph_memory)
    print(json.dumps(row, indent=1))
    with open(path, "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
