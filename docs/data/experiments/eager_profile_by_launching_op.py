"""Session 21: eager (un-captured) profile of one Wan channels_last decode, each kernel attributed to the ATen/
custom op that launched it, its input shapes and the innermost rewrite/ source line (with_stack). Session 31: a
sixth argument "encode" profiles an encode of a video of that size instead.

    python eager_profile_by_launching_op.py MODEL HxW FRAMES LEVEL OUT.json [encode]"""
import collections, json, sys, time
import torch
from torch.profiler import ProfilerActivity, profile
from rewrite import optimize, supported

model, size, frames, level = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
h, w = map(int, size.split("x"))
out_path = sys.argv[5]
vae = supported.get(model).build("full", device="cuda", dtype=torch.bfloat16)
z_ch = vae.config.z_dim
scale = 16 if model == "wan2.2" else 8
z = torch.randn(1, z_ch, (frames - 1) // 4 + 1, h // scale, w // scale, generator=torch.Generator().manual_seed(0))
z = z.to("cuda", torch.bfloat16)
optimize(vae, level=level)
if sys.argv[6:] == ["encode"]:
    video = (torch.rand(1, 3, frames, h, w, generator=torch.Generator().manual_seed(0)) * 2 - 1).to("cuda", z.dtype)
    run = lambda: vae.encode(video)  # noqa: E731
else:
    run = lambda: vae.decode(z)  # noqa: E731


class Eager:
    @staticmethod
    def can_capture(device): return True
    @staticmethod
    def new_pool(): return None
    @staticmethod
    def capture(fn, inputs, pool):
        class Step:
            def replay(self): return fn(*inputs)
        return Step()


runner = vae.__dict__["_rewrite_runner"]
runner.graph_backend = Eager()
with torch.no_grad():
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    t = time.perf_counter(); run(); torch.cuda.synchronize(); print("eager s", time.perf_counter() - t)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_stack=True) as prof:
        run()
        torch.cuda.synchronize()
rows = collections.defaultdict(lambda: [0.0, 0])
for e in prof.events():
    if not e.kernels or e.device_type.name != "CPU":
        continue
    frame = next((f for f in (e.stack or []) if "/rewrite/" in f or "/diffusers/" in f), "?")
    for k in e.kernels:
        key = (k.name[:70], e.name, str(e.input_shapes)[:160], frame[-110:])
        rows[key][0] += k.duration / 1000.0
        rows[key][1] += 1
table = sorted(([round(v[0], 3), v[1], *k] for k, v in rows.items()), reverse=True)
json.dump(table, open(out_path, "w"), indent=0)
total = sum(r[0] for r in table)
print(f"attributed kernel ms {total:.1f}")
for r in table[:45]:
    print(f"{r[0]:9.3f} {r[1]:4d} | {r[2][:45]} | {r[3]} | {r[4][:90]} | {r[5][-70:]}")
