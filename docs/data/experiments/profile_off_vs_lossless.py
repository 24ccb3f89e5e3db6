"""Issue 37 item 4: where `off` and `lossless` spend their kernel time at one size, side by side.

One full-size random-init Wan decoder, one latent clip; for each level one untimed decode, three timed ones,
then one under the profiler, eager by default (un-captured: the graph backend replaced by a pass-through). Per level: kernel time
by category (cuDNN conv, the NCHW<->NHWC transposes around it, attention, Triton kernels of this project,
ATen elementwise/copy/cat, other), the top kernels, and per conv call site (input shape x weight shape) the
conv's kernel time in both levels: whether `lossless`'s convs run as fast as `off`'s decides how far below
`off` the bit-identical level can go.

    python profile_off_vs_lossless.py wan2.1 1088x1920 5 OUT.json [LEVELS]

With GRAPHS=1 the levels replay their CUDA graphs under the profiler (the kernels of a graph are attributed
to its launch), and the GPU's SM clock and power are sampled (`nvidia-smi`, every 50 ms) over three timed
decodes per level: a kernel that takes longer inside one level's decode than inside the other's, at the
same launch configuration, shows there as a lower clock.
"""
import collections
import json
import os
import subprocess
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from rewrite import optimize, supported

model, size, frames, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
levels = sys.argv[5].split(",") if len(sys.argv) > 5 else ["off", "lossless"]
h, w = map(int, size.split("x"))
DEVICE = os.environ.get("DEVICE", "cuda")  # DEVICE=cpu CONFIG=tiny: a smoke run of this script
vae = supported.get(model).build(os.environ.get("CONFIG", "full"), device=DEVICE, dtype=torch.bfloat16)
scale = 16 if model == "wan2.2" else 8
z = torch.randn(1, vae.config.z_dim, (frames - 1) // 4 + 1, h // scale, w // scale,
                generator=torch.Generator().manual_seed(0)).to(DEVICE, torch.bfloat16)


class PassThrough:
    """A graph backend whose 'graphs' call the step function: the rewritten ops run eagerly."""
    @staticmethod
    def can_capture(device): return True
    @staticmethod
    def new_pool(): return None
    @staticmethod
    def capture(fn, inputs, pool):
        class Step:
            def replay(self): return fn(*inputs)
        return Step()


def category(name: str) -> str:
    n = name.lower()
    if "nchwtonhwc" in n or "nhwctonchw" in n:
        return "transpose"
    if "flash" in n or "fmha" in n or "attention" in n or "softmax" in n:
        return "attention"
    if any(k in n for k in ("conv", "xmma", "cudnn", "implicit", "sm90_", "sm80_", "cutlass", "gemm", "wgrad")):
        return "conv"
    if "elementwise" in n or "vectorized" in n or "reduce" in n:
        return "aten elementwise/reduce"
    if "cat" in n or "copy" in n or "memcpy" in n or "memset" in n:
        return "copy/cat"
    if n.startswith("_") or "triton" in n:
        return "triton (project)"
    return "other"


CONV_OPS = ("aten::cudnn_convolution", "aten::convolution", "aten::_convolution")
results = {}
for level in levels:
    optimize(vae, level=level)
    runner = vae.__dict__.get("_rewrite_runner")
    if runner is not None and os.environ.get("GRAPHS") != "1":
        runner.graph_backend = PassThrough()
    with torch.no_grad():
        vae.decode(z)
        (torch.cuda.synchronize() if DEVICE == "cuda" else None)
        sampler = None
        if os.environ.get("GRAPHS") == "1":
            sampler = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                        "-lms", "50"], stdout=subprocess.PIPE, text=True)
        t = time.perf_counter()
        for _ in range(3):
            vae.decode(z)
        (torch.cuda.synchronize() if DEVICE == "cuda" else None)
        wall = (time.perf_counter() - t) / 3
        clocks = None
        if sampler is not None:
            sampler.terminate()
            samples = [tuple(map(float, line.split(","))) for line in sampler.stdout.read().splitlines()
                       if line.count(",") == 1 and "N/A" not in line]
            samples = samples[len(samples) // 5:]  # the first fifth overlaps the start-up of the sampler
            if samples:
                clocks = {"sm_mhz_mean": sum(c for c, _ in samples) / len(samples), "sm_mhz_min": min(c for c, _ in samples),
                          "power_w_mean": sum(p for _, p in samples) / len(samples), "samples": len(samples)}
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            vae.decode(z)
            (torch.cuda.synchronize() if DEVICE == "cuda" else None)
    cats = collections.Counter()
    kernels = collections.Counter()
    counts = collections.Counter()
    sites = collections.defaultdict(lambda: collections.Counter())
    for e in prof.events():
        if not e.kernels or e.device_type.name != "CPU":
            continue
        for k in e.kernels:
            ms = k.duration / 1000.0
            c = category(k.name)
            cats[c] += ms
            kernels[k.name[:90]] += ms
            counts[k.name[:90]] += 1
            if e.name == "aten::cudnn_convolution" and e.input_shapes and len(e.input_shapes) > 1:
                site = f"{e.input_shapes[0]} x {e.input_shapes[1]}"
                sites[site][c] += ms
                sites[site]["calls"] += 1 if c == "conv" else 0
    total = sum(cats.values())
    results[level] = {
        "wall_s": wall, "clocks": clocks, "graphs": os.environ.get("GRAPHS") == "1", "kernel_ms": total, "categories_ms": dict(cats),
        "top_kernels": [[n, round(ms, 3), counts[n]] for n, ms in kernels.most_common(30)],
        "conv_sites": {s: dict(v) for s, v in sites.items()},
    }
    print(f"== {level}: wall {wall:.3f} s per decode, kernel time {total:.1f} ms, clocks {clocks}")
    for c, ms in cats.most_common():
        print(f"   {c:26s} {ms:9.1f} ms  {100 * ms / total:5.1f}%")
    for n, ms in kernels.most_common(12):
        print(f"   {ms:9.1f} ms {counts[n]:5d}  {n}")
    optimize(vae, level="off")
    torch.cuda.empty_cache() if DEVICE == "cuda" else None

if "off" in results and "lossless" in results:
    print("== conv call sites: conv-kernel ms off / lossless (transposes off / lossless)")
    off_s, ll_s = results["off"]["conv_sites"], results["lossless"]["conv_sites"]
    rows = []
    for s in set(off_s) | set(ll_s):
        a, b = off_s.get(s, {}), ll_s.get(s, {})
        rows.append((a.get("conv", 0.0), b.get("conv", 0.0), a.get("transpose", 0.0), b.get("transpose", 0.0), s))
    for a, b, ta, tb, s in sorted(rows, reverse=True)[:30]:
        print(f"   {a:8.1f} {b:8.1f}  ({ta:6.1f} {tb:6.1f})  {s[:110]}")
    print("   total conv", round(sum(r[0] for r in rows), 1), round(sum(r[1] for r in rows), 1),
          "transposes", round(sum(r[2] for r in rows), 1), round(sum(r[3] for r in rows), 1))
json.dump({"model": model, "size": size, "frames": frames, "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
           "torch": torch.__version__, "levels": results}, open(out_path, "w"), indent=1)
