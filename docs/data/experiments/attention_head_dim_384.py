"""Experiment (session 17, not taken; docs/results.md): the Wan middle block's attention (one head of dim 384)
at the Wan 2.1 720p / 480p latent sizes, per SDPA backend and as a chunked cuBLAS form (fp32 logits, fp32
softmax, bf16 probabilities), against an fp32 reference. Not part of the package; run on a GPU machine:
``python docs/data/experiments/attention_head_dim_384.py out.json``."""
import torch, torch.nn.functional as F, time, json, sys
from torch.nn.attention import sdpa_kernel, SDPBackend
dev = "cuda"
res = {}
def bench(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n
def chunked(q, k, v, rows):
    b, h, n, d = q.shape
    out = torch.empty_like(q)
    scale = d ** -0.5
    qf = q.reshape(b * h, n, d); kf = k.reshape(b * h, n, d); vf = v.reshape(b * h, n, d); of = out.view(b * h, n, d)
    for i in range(b * h):
        for r0 in range(0, n, rows):
            s = torch.mm(qf[i, r0:r0 + rows], kf[i].T, out_dtype=torch.float32)
            p = torch.softmax(s.mul_(scale), -1).to(q.dtype)
            torch.mm(p, vf[i], out=of[i, r0:r0 + rows])
    return out
for name, (n, d) in {"720p": (90 * 160, 384), "480p": (60 * 104, 384)}.items():
    g = torch.Generator(device=dev).manual_seed(0)
    qkv = torch.randn(1, 1, n, 3 * d, device=dev, dtype=torch.bfloat16, generator=g)
    q, k, v = qkv.chunk(3, dim=-1)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    r = {}
    for label, backend in [("default", None), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                           ("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                           ("math", SDPBackend.MATH)]:
        try:
            if backend is None:
                fn = lambda: F.scaled_dot_product_attention(q, k, v)
            else:
                def fn(backend=backend):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v)
            o = fn()
            r[label] = {"ms": bench(fn), "max_abs": (o.float() - ref).abs().max().item()}
        except Exception as exc:
            r[label] = {"error": str(exc)[:200]}
    for rows in (2048, 4096, 8192):
        try:
            fn = lambda rows=rows: chunked(q, k, v, rows)
            o = fn()
            r[f"chunked{rows}"] = {"ms": bench(fn), "max_abs": (o.float() - ref).abs().max().item(),
                                   "peak_MiB": None}
        except Exception as exc:
            r[f"chunked{rows}"] = {"error": str(exc)[:200]}
    res[name] = r
    print(name, json.dumps(r, indent=1), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
