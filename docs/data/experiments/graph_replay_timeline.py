"""Issue 37 item 4: where the time of a graph-replayed `lossless` Wan decode goes, from the GPU's timeline.

The profiler's per-op view does not attribute a CUDA graph's kernels (they carry the graph launch's
correlation), so this reads the raw activity records: every kernel and copy on the device (their summed
time, and the union of their intervals: the GPU's busy time), the idle gaps between them, the host calls
that overlap the largest gaps, and the host's CUDA runtime calls by total time.

    python graph_replay_timeline.py wan2.1 1088x1920 21 LEVEL OUT.json
"""
import collections
import json
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from rewrite import optimize, supported

model, size, frames, level, out_path = sys.argv[1:6]
frames = int(frames)
h, w = map(int, size.split("x"))
vae = supported.get(model).build("full", device="cuda", dtype=torch.bfloat16)
scale = 16 if model == "wan2.2" else 8
z = torch.randn(1, vae.config.z_dim, (frames - 1) // 4 + 1, h // scale, w // scale,
                generator=torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
optimize(vae, level=level)
with torch.no_grad():
    vae.decode(z)
    vae.decode(z)
    torch.cuda.synchronize()
    t = time.perf_counter(); vae.decode(z); torch.cuda.synchronize(); wall = time.perf_counter() - t
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter(); vae.decode(z); torch.cuda.synchronize(); profiled_wall = time.perf_counter() - t
events = prof.profiler.kineto_results.events()
device = sorted(((e.start_ns(), e.end_ns(), e.name()) for e in events if e.device_type().name == "CUDA"
                 and e.duration_ns() > 0), key=lambda r: r[0])
host = [(e.start_ns(), e.end_ns(), e.name()) for e in events if e.device_type().name == "CPU"]
kernel_ms = sum(b - a for a, b, _ in device) / 1e6
busy, gaps, end = 0, [], None
for a, b, name in device:
    if end is None or a > end:
        if end is not None:
            gaps.append((a - end, end, a, name))
        busy += b - a
        end = b
    elif b > end:
        busy += b - end
        end = b
span_ms = (device[-1][1] - device[0][0]) / 1e6 if device else 0.0
by_name = collections.Counter()
count = collections.Counter()
for a, b, name in device:
    by_name[name[:90]] += (b - a) / 1e6
    count[name[:90]] += 1
runtime = collections.Counter()
runtime_n = collections.Counter()
for a, b, name in host:
    if name.startswith("cuda") or name.startswith("cu"):
        runtime[name] += (b - a) / 1e6
        runtime_n[name] += 1
top_gaps = []
for gap, a, b, next_kernel in sorted(gaps, reverse=True)[:12]:
    overlapping = collections.Counter()
    for ha, hb, name in host:
        if hb > a and ha < b and (name.startswith("cuda") or name.startswith("aten::") or name.startswith("rewrite")):
            overlapping[name] += (min(hb, b) - max(ha, a)) / 1e6
    top_gaps.append({"gap_ms": gap / 1e6, "before": next_kernel[:60],
                     "host": [[n, round(ms, 2)] for n, ms in overlapping.most_common(5)]})
summary = {"model": model, "size": size, "frames": frames, "level": level, "gpu": torch.cuda.get_device_name(),
           "wall_s": wall, "profiled_wall_s": profiled_wall, "device_records": len(device),
           "kernel_ms": kernel_ms, "busy_ms": busy / 1e6, "span_ms": span_ms, "idle_ms": span_ms - busy / 1e6,
           "gaps_over_1ms": sum(1 for g in gaps if g[0] > 1e6), "gap_ms_over_1ms": sum(g[0] for g in gaps if g[0] > 1e6) / 1e6,
           "top_gaps": top_gaps,
           "top_kernels": [[n, round(ms, 2), count[n]] for n, ms in by_name.most_common(20)],
           "runtime_calls": [[n, round(ms, 2), runtime_n[n]] for n, ms in runtime.most_common(12)]}
json.dump(summary, open(out_path, "w"), indent=1)
print(f"{model} {size}x{frames} {level}: wall {wall:.3f} s (profiled {profiled_wall:.3f}), device records "
      f"{len(device)}, kernel sum {kernel_ms:.1f} ms, busy {busy / 1e6:.1f} ms of span {span_ms:.1f} ms, "
      f"gaps > 1 ms: {summary['gaps_over_1ms']} totalling {summary['gap_ms_over_1ms']:.1f} ms")
for g in top_gaps[:8]:
    print(f"   gap {g['gap_ms']:7.2f} ms before {g['before']} | host {g['host']}")
for n, ms, c in summary["top_kernels"][:12]:
    print(f"   {ms:9.1f} ms {c:5d}  {n}")
for n, ms, c in summary["runtime_calls"][:8]:
    print(f"   host {ms:9.1f} ms {c:5d}  {n}")
