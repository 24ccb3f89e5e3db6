"""Session 21: the kernels of one eager steady step of a Wan channels_last decode, in launch order, each with the
innermost profiler op that launched it (to place the elementwise kernels)."""
import collections, sys, time
import torch
from torch.profiler import ProfilerActivity, profile, record_function
from rewrite import optimize, supported

model, size, level = sys.argv[1], sys.argv[2], sys.argv[3]
h, w = map(int, size.split("x"))
vae = supported.get(model).build("full", device="cuda", dtype=torch.bfloat16)
scale = 16 if model == "wan2.2" else 8
z = torch.randn(1, vae.config.z_dim, 3, h // scale, w // scale, generator=torch.Generator().manual_seed(0))
z = z.to("cuda", torch.bfloat16)
optimize(vae, level=level)


class Eager:
    @staticmethod
    def can_capture(device): return True
    @staticmethod
    def new_pool(): return None
    @staticmethod
    def capture(fn, inputs, pool):
        class Step:
            def replay(self):
                torch.cuda.synchronize()
                with record_function("STEP"):
                    out = fn(*inputs)
                    torch.cuda.synchronize()
                return out
        return Step()


vae.__dict__["_rewrite_runner"].graph_backend = Eager()
with torch.no_grad():
    vae.decode(z); vae.decode(z); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        vae.decode(z)
        torch.cuda.synchronize()
events = list(prof.events())
steps = sorted([e for e in events if e.name == "STEP"], key=lambda e: e.time_range.start)
last = steps[-1]
cpu_ops = [e for e in events if e.device_type.name == "CPU" and e.name != "STEP"
           and last.time_range.start <= e.time_range.start <= last.time_range.end]
kernel_rows = []
for e in cpu_ops:
    for k in e.kernels:
        kernel_rows.append((e.time_range.start, k.name[:60], e.name, str(e.input_shapes)[:110], k.duration))
kernel_rows.sort()
print(f"steps {len(steps)}, kernels in the last {len(kernel_rows)}, device ms {sum(r[4] for r in kernel_rows)/1000:.2f}")
for r in kernel_rows:
    print(f"{r[4]/1000:8.3f} | {r[1]} | {r[2]} | {r[3]}")
c = collections.Counter(r[1][:40] for r in kernel_rows)
print(c.most_common(20))
