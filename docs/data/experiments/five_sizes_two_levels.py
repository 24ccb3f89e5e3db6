"""Issue 37's serving target: one process, full Wan 2.1 in bf16, one module per level (`lossless`, `channels_last`),
each decoding the five sizes of the issue (720x1280, 480x832, 544x960 at 21 frames, one frame at 480x832, 240x416
batch 2), then a third module's first decode at `off`. Target on an 80 GB card: no error; every decode through the
graphs or a logged fallback. Prints one JSON line per decode (path, reason, graph memory held, reserved) and a
summary; `--tiny` runs the tiny config on whatever device is there (a smoke test of this script).

Run from the repository root: `python3 docs/data/experiments/five_sizes_two_levels.py [--tiny] [OUT.json]`.
"""
import gc
import json
import sys

import torch

from rewrite import optimize, report
from rewrite.models.wan.config import build_wan

GIB = 2**30
TINY = "--tiny" in sys.argv
OUT = next((a for a in sys.argv[1:] if a.endswith(".json")), None)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPE = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
# (batch, height, width, frames) in video pixels
SIZES = [(1, 720, 1280, 21), (1, 480, 832, 21), (1, 544, 960, 21), (1, 480, 832, 1), (2, 240, 416, 21)]
if TINY:
    SIZES = [(b, h // 8, w // 8, min(f, 5)) for b, h, w, f in SIZES]


def latents(vae, batch: int, height: int, width: int, frames: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(height * width + frames)
    shape = (batch, vae.config.z_dim, 1 + (frames - 1) // 4, height // 8, width // 8)
    return torch.randn(shape, generator=generator).to(DEVICE, DTYPE)


def reserved() -> float:
    return torch.cuda.memory_reserved() / GIB if DEVICE.type == "cuda" else 0.0


rows, errors = [], []
modules = {}
for level in ("lossless", "channels_last", "off"):
    vae = build_wan("wan2.1", "tiny" if TINY else "full").to(DEVICE, DTYPE)
    optimize(vae, level)
    modules[level] = vae
    for batch, height, width, frames in (SIZES if level != "off" else SIZES[:1]):
        row = {"level": level, "size": f"{batch}x{height}x{width}x{frames}"}
        try:
            with torch.no_grad():
                vae.decode(latents(vae, batch, height, width, frames))
            summary = report(vae)
            held = summary.graph_memory
            row.update(path=summary.last_path, reason=summary.last_reason,
                       graphs_gib=None if held is None else round(held.total / GIB, 2))
        except Exception as error:  # the target: none; record it and go on
            row.update(error=f"{type(error).__name__}: {str(error)[:200]}")
            errors.append(row)
        row["reserved_gib"] = round(reserved(), 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    gc.collect()
summary = {"device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu", "torch": torch.__version__,
           "errors": len(errors), "decodes": len(rows),
           # an optimized level's decode that neither ran the graphs nor logged why (the target: none)
           "unexplained": [r for r in rows if r["level"] != "off" and r.get("path") != "graphs" and not r.get("reason")],
           "rows": rows}
print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))
if OUT:
    with open(OUT, "w") as f:
        json.dump(summary, f, indent=1)
