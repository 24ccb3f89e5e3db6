"""Session 23: what keeps GPU memory after an optimized Wan VAE is deleted (issue 37, item 1).

Per level: build the full Wan 2.1 VAE in bf16 on the GPU, optimize, decode 720x1280 (6 latent frames), then
`del vae; gc.collect(); torch.cuda.empty_cache()`; print `memory_allocated()` against the start, whether the
runner is still alive (and who refers to it), and the allocation stacks of the blocks still allocated
(`torch.cuda.memory._record_memory_history`), grouped by their innermost `rewrite` frame.
"""

import collections
import gc
import json
import os
import sys
import weakref

import torch

from rewrite import optimize
from rewrite.models.wan.config import build_wan

GIB = 2**30
out_dir = os.environ.get("OUT", ".")


def holders(obj, depth=3):
    """Referrer chain summary (types) of obj, a few levels up."""
    lines, frontier, seen = [], [obj], {id(obj)}
    for level in range(depth):
        nxt = []
        for o in frontier:
            for r in gc.get_referrers(o):
                if id(r) in seen or r is frontier or isinstance(r, type(sys._getframe())):
                    continue
                seen.add(id(r))
                desc = type(r).__name__
                if isinstance(r, dict):
                    keys = [k for k, v in r.items() if v is o][:3]
                    desc += f" keys={keys}"
                lines.append(f"{'  ' * level}{desc}")
                nxt.append(r)
        frontier = nxt[:20]
    return lines[:60]


def probe(level, frames=6, size=(90, 160)):
    gc.collect(); torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    vae = build_wan("wan2.1", "full").to("cuda", torch.bfloat16)
    weights = torch.cuda.memory_allocated() - start
    optimize(vae, level)
    z = torch.randn(1, 16, frames, *size, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        out = vae.decode(z).sample
        out = vae.decode(z).sample  # the replay
    del out, z
    runner = weakref.ref(vae._rewrite_runner)
    after_decode = torch.cuda.memory_allocated() - start
    del vae
    gc.collect(); torch.cuda.empty_cache()
    left = torch.cuda.memory_allocated() - start
    result = {"level": level, "weights_gib": weights / GIB, "after_decode_gib": after_decode / GIB,
              "left_after_del_gib": left / GIB, "runner_alive": runner() is not None,
              "reserved_gib": torch.cuda.memory_reserved() / GIB}
    if runner() is not None:
        result["runner_holders"] = holders(runner())
    snapshot = torch.cuda.memory._snapshot()
    by_frame = collections.Counter()
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            frames_ = block.get("frames", [])
            ours = [f for f in frames_ if "/rewrite/" in f["filename"] or "/passes/" in f["filename"]
                    or "/patterns/" in f["filename"] or "/tools/" in f["filename"]]
            key = " <- ".join(f"{os.path.basename(f['filename'])}:{f['line']}:{f['name']}" for f in ours[:4]) or \
                " <- ".join(f"{os.path.basename(f['filename'])}:{f['line']}:{f['name']}" for f in frames_[:4])
            by_frame[(key, segment.get("segment_pool_id"))] += block["size"]
    result["left_blocks"] = [{"where": k[0], "pool": str(k[1]), "gib": v / GIB} for k, v in by_frame.most_common(25)]
    torch.cuda.memory._record_memory_history(enabled=None)
    print(json.dumps(result, indent=1), flush=True)
    return result


if __name__ == "__main__":
    results = [probe(level) for level in sys.argv[1:] or ["lossless", "channels_last"]]
    with open(os.path.join(out_dir, "memory_probe.json"), "w") as f:
        json.dump(results, f, indent=1)
