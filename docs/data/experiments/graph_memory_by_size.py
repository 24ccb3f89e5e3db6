"""Session 23: the memory an optimized full Wan 2.1 VAE (bf16) holds per decoded size (issue 37, item 2's
baseline): after each decode, `memory_allocated()` above the weights (CUDA graphs, pools, static buffers)."""

import gc
import json
import os
import sys

import torch

from rewrite import optimize
from rewrite.models.wan.config import build_wan

GIB = 2**30
SIZES = [(720, 1280, 21), (480, 832, 21), (544, 960, 21), (480, 832, 1)]


def held() -> int:
    gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


level = sys.argv[1] if len(sys.argv) > 1 else "lossless"
vae = build_wan("wan2.1", "full").to("cuda", torch.bfloat16)
weights = held()
optimize(vae, level)
rows = []
for height, width, frames in SIZES:
    z = torch.randn(1, 16, 1 + (frames - 1) // 4, height // 8, width // 8, device="cuda", dtype=torch.bfloat16)
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        vae.decode(z)
    peak = torch.cuda.max_memory_allocated()
    rows.append({"size": f"{height}x{width}x{frames}", "held_gib": (held() - weights) / GIB,
                 "peak_gib": (peak - weights) / GIB})
    print(rows[-1], flush=True)
with open(os.path.join(os.environ.get("OUT", "."), f"graph_memory_by_size_{level}.json"), "w") as f:
    json.dump(rows, f, indent=1)
