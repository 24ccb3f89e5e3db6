"""Experiment (session 17, rejected; docs/tuning.md 1.9): the 96-channel 3x3x3 conv with three 32-channel
accumulators sharing one register copy of the input tile (wgmma with A from registers), against the production
kernel (64 + 32) and cuDNN. Not part of the package; run on a GPU machine from the project root:
``python docs/data/experiments/conv96_three_accumulators.py out.json``. The BLOCK_K = 64 rows it prints are
invalid (96 channels are not a multiple of 64: a third of the reduction is skipped, hence their max-abs)."""
import sys, os, json
import torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def conv96x3(a_desc, w_desc, o_desc, T_OUT, TP, HP, WP, H_OUT, W_TILES, C_IN: tl.constexpr, BLOCK_W: tl.constexpr,
             BLOCK_K: tl.constexpr, STAGES: tl.constexpr, A_REGS: tl.constexpr):
    tile = tl.program_id(0)
    frame = tl.program_id(1)
    h = tile // W_TILES
    w0 = (tile % W_TILES) * BLOCK_W
    t = frame % T_OUT
    b = frame // T_OUT
    blocks: tl.constexpr = C_IN // BLOCK_K
    acc0 = tl.zeros((BLOCK_W, 32), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_W, 32), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_W, 32), dtype=tl.float32)
    for step in tl.range(0, 27 * blocks, num_stages=STAGES):
        tap = step // blocks
        c0 = (step % blocks) * BLOCK_K
        i = tap // 9
        j = (tap // 3) % 3
        k = tap % 3
        w0t = w_desc.load([0, tap * C_IN + c0])
        w1t = w_desc.load([32, tap * C_IN + c0])
        w2t = w_desc.load([64, tap * C_IN + c0])
        a = a_desc.load([((b * TP + t + i) * HP + h + j) * WP + w0 + k, c0])
        if A_REGS:
            a = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [a], dtype=a.dtype, is_pure=True, pack=2)
        acc0 = tl.dot(a, w0t.T, acc0)
        acc1 = tl.dot(a, w1t.T, acc1)
        acc2 = tl.dot(a, w2t.T, acc2)
    row = (b * T_OUT + t) * H_OUT + h
    o_desc.store([row, w0, 0], tl.reshape(acc0.to(tl.bfloat16), [1, BLOCK_W, 32]))
    o_desc.store([row, w0, 32], tl.reshape(acc1.to(tl.bfloat16), [1, BLOCK_W, 32]))
    o_desc.store([row, w0, 64], tl.reshape(acc2.to(tl.bfloat16), [1, BLOCK_W, 32]))


def run(padded, weight, out, block_w, block_k, stages, warps, a_regs):
    bt, c, tp, hp, wp = padded.shape
    o = weight.shape[0]
    _, _, t_out, h_out, w_out = out.shape
    a2d = padded.permute(0, 2, 3, 4, 1).reshape(-1, c)
    w2d = weight.permute(0, 2, 3, 4, 1).reshape(o, -1)
    o3d = out.permute(0, 2, 3, 4, 1).reshape(bt * t_out * h_out, w_out, o)
    a_desc = TensorDescriptor.from_tensor(a2d, [block_w, block_k])
    w_desc = TensorDescriptor.from_tensor(w2d, [32, block_k])
    o_desc = TensorDescriptor.from_tensor(o3d, [1, block_w, 32])
    w_tiles = triton.cdiv(w_out, block_w)
    conv96x3[(w_tiles * h_out, bt * t_out)](a_desc, w_desc, o_desc, t_out, tp, hp, wp, h_out, w_tiles, C_IN=c,
                                            BLOCK_W=block_w, BLOCK_K=block_k, STAGES=stages, A_REGS=a_regs,
                                            num_warps=warps)


def main():
    from rewrite.kernels.conv3d import conv3d as triton_conv3d
    res = {}
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    for name, (t, h, w) in {"720p": (4, 720, 1280), "480p": (4, 480, 832)}.items():
        torch.manual_seed(0)
        cl = torch.channels_last_3d
        padded = torch.randn(1, 96, t + 2, h + 2, w + 2, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
        weight = (torch.randn(96, 96, 3, 3, 3, device="cuda", dtype=torch.bfloat16) / 50).contiguous(memory_format=cl)
        ref = torch.ops.aten.conv3d.default(padded, weight, None)
        out = torch.empty(ref.shape, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
        flops = 2 * 96 * 96 * 27 * t * h * w
        r = {}
        ms = triton.testing.do_bench_cudagraph(lambda: torch.ops.aten.conv3d.default(padded, weight, None))
        r["cudnn"] = flops / ms / 1e9
        ms = triton.testing.do_bench_cudagraph(lambda: triton_conv3d.conv3d_channels_last(padded, weight, None, None, out))
        r["production"] = flops / ms / 1e9
        for bw, bk, st, wa in ((256, 32, 4, 8), (256, 32, 3, 8), (128, 32, 4, 4), (128, 32, 3, 4), (128, 64, 3, 4), (256, 64, 3, 8)):
            for a_regs in (False, True):
                key = f"3x32 w{bw} k{bk} s{st} warps{wa} aregs{a_regs}"
                try:
                    fn = lambda: run(padded, weight, out, bw, bk, st, wa, a_regs)
                    fn()
                    err = (out.float() - ref.float()).abs().max().item()
                    ms = triton.testing.do_bench_cudagraph(fn)
                    r[key] = (flops / ms / 1e9, err)
                except Exception as e:
                    r[key] = str(e)[:150]
                print(name, key, r[key], flush=True)
        print(name, "cudnn", r["cudnn"], "production", r["production"], flush=True)
        res[name] = r
    json.dump(res, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
