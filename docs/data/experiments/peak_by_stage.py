"""Probe (session 36, issue 40): where a `channels_last` Wan decode reaches its peak memory, and what the kept
Winograd weight transforms hold. Builds the bench's decoder (same seed), then reports allocated and peak memory
after each stage: optimize, `rewrite.warmup`, the first decode (captures), a replayed decode, and the bytes of
`weight_store`'s kept transforms. With a sweep JSON, its Winograd winners are routed first, as
`bench_with_winograd_winners.py` does. On a CPU it runs (tiny config) and prints n/a for memory.

    python peak_by_stage.py [--model wan2.2] [--config full] [--size 720x1280] [--frames 81] [--winners SWEEP.json]
"""
import argparse
import json

import torch

import rewrite
from rewrite import supported
from rewrite.kernels.winograd import common, weight_store
from rewrite.tools.bench import MODEL_SEED
from rewrite.tools.sweep_winograd import winners

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="wan2.2")
parser.add_argument("--config", default="full")
parser.add_argument("--size", default="720x1280")
parser.add_argument("--frames", type=int, default=81)
parser.add_argument("--winners")
args = parser.parse_args()
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
if args.winners and device.type == "cuda":
    entries = common._MEASURED_FASTER.setdefault(torch.cuda.get_device_name(), {})
    for key, tile in winners(json.load(open(args.winners))).items():
        entries.setdefault(key, tile)
GIB = 2 ** 30


def line(stage: str) -> None:
    if device.type != "cuda":
        print(f"{stage:<28} allocated n/a  peak n/a")
        return
    torch.cuda.synchronize()
    print(f"{stage:<28} allocated {torch.cuda.memory_allocated() / GIB:6.2f} GiB  "
          f"peak {torch.cuda.max_memory_allocated() / GIB:6.2f} GiB", flush=True)
    torch.cuda.reset_peak_memory_stats()


vae = supported.get(args.model).build(args.config, seed=MODEL_SEED, device=device, dtype=dtype)
height, width = (int(v) for v in args.size.split("x"))
ratio = vae.spatial_compression_ratio
z = torch.randn(1, vae.config.z_dim, 1 + (args.frames - 1) // 4, height // ratio, width // ratio,
                generator=torch.Generator().manual_seed(0)).to(device, dtype)
with torch.no_grad():
    line("built")
    vae.decode(z)
    line("off decode")
    rewrite.optimize(vae, level="channels_last")
    line("optimize")
    rewrite.warmup(vae, device=device, dtype=dtype)
    line("warmup")
    vae.decode(z)
    line("first decode")
    vae.decode(z)
    line("second decode")
kept = sum(t.numel() * t.element_size() for entry in weight_store._TRANSFORMED.values() for t in entry.transformed)
print(f"kept Winograd weight transforms: {len(weight_store._TRANSFORMED)}, {kept / GIB:.2f} GiB")
print(f"graph memory: {getattr(rewrite.report(vae), 'graph_memory', None)}")
