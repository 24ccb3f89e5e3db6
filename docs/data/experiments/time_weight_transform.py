"""Probe (session 37, issue 40): what F(4x4, 3x3)'s weight transform costs now that the fast op runs it on every
call (`weight_points.transformed_weight_4_on_device`), at Wan's decoder conv weights: median ms by
``triton.testing.do_bench_cudagraph`` and the bytes it moves (the weight read by each of its two passes, the fp16
points written) over that time; and its second pass alone (what a transform with kept point scales would cost).
Needs CUDA.

    python time_weight_transform.py
"""
import torch
import triton.testing

from rewrite.kernels.winograd import weight_points
from rewrite.kernels.winograd.weight_points import transformed_weight_4_on_device

print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
for cin, cout in ((1024, 1024), (1024, 512), (512, 512), (512, 256), (256, 256), (384, 384), (192, 192)):
    weight = torch.randn(cout, cin, 3, 3, 3, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last_3d)
    ms = triton.testing.do_bench_cudagraph(lambda w=weight: transformed_weight_4_on_device(w))
    moved = 2 * weight.numel() * weight.element_size() + 36 * 3 * cin * cout * 2
    u, scales = transformed_weight_4_on_device(weight)
    second = triton.testing.do_bench_cudagraph(
        lambda w=weight, u=u, s=scales: weight_points.scaled_points_4_into(w, s, u))
    print(f"{cin:5d} -> {cout:5d}: {ms:7.3f} ms, {moved / ms / 1e9:5.2f} TB/s; the scaled pass alone {second:7.3f} ms",
          flush=True)
