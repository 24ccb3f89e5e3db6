"""Probe (session 28): the Wan 2.1 encoder's downsampler convs at 720x1280 (4 frames a step) on the running GPU:
the self-check's verdict for the channels-last path, and the times of the reference (pad + NCHW conv2d / cat + pad +
conv3d) against `rewrite::pad_conv2d` / `rewrite::time_conv` and a bare channels-last conv."""
import torch
import torch.nn.functional as F

from rewrite.models.wan import downsample
from rewrite.ops import selftest


def timed(fn, repeat=20):
    fn(); torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record(); torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat


dev, dt = torch.device("cuda"), torch.bfloat16
print(torch.cuda.get_device_name(), torch.__version__, "cudnn.benchmark", torch.backends.cudnn.benchmark)
with torch.no_grad():
    for c, h, w in ((96, 720, 1280), (192, 360, 640), (384, 180, 320)):
        x = torch.randn(4, c, h, w, device=dev, dtype=dt)
        wt = torch.randn(c, c, 3, 3, device=dev, dtype=dt) * 0.05
        b = torch.randn(c, device=dev, dtype=dt)
        pad, stride = [0, 1, 0, 1], [2, 2]
        exact = selftest.strided_channels_last_conv_is_exact(downsample.padded_shape(x.shape, pad), tuple(wt.shape),
                                                             tuple(stride), dt, dev)
        ref = lambda: downsample.pad_conv2d_reference(x, pad, wt, b, stride)
        op = lambda: torch.ops.rewrite.pad_conv2d(x, pad, wt, b, stride)
        xp = F.pad(x, pad).contiguous(memory_format=torch.channels_last)
        wcl = wt.contiguous(memory_format=torch.channels_last)
        bare = lambda: F.conv2d(xp, wcl, None, stride)
        flops = 2 * c * c * 9 * 4 * (h // 2) * (w // 2)
        times = [timed(f) for f in (ref, op, bare)]
        print(f"pad_conv2d {c} @ 4x{h}x{w}: self-check {exact}; equal {torch.equal(op(), ref())}; reference "
              f"{times[0]:.3f} ms, op {times[1]:.3f} ms, bare channels-last conv {times[2]:.3f} ms "
              f"({flops / times[2] / 1e9:.0f} TFLOP/s)")
    for c, h, w in ((192, 360, 640), (384, 180, 320)):
        x = torch.randn(1, c, 4, h, w, device=dev, dtype=dt)
        cache = torch.randn(1, c, 2, h, w, device=dev, dtype=dt)
        wt = torch.randn(c, c, 3, 1, 1, device=dev, dtype=dt) * 0.05
        b = torch.randn(c, device=dev, dtype=dt)
        pad, stride = [0, 0, 0, 0, 0, 0], [2, 1, 1]
        ref = lambda: downsample.time_conv_reference(x, cache, pad, wt, b, stride)
        op = lambda: torch.ops.rewrite.time_conv(x, cache, pad, wt, b, stride)
        exact = selftest.strided_channels_last_conv_is_exact((1, c, 5, h, w), tuple(wt.shape), tuple(stride), dt, dev)
        times = [timed(f) for f in (ref, op)]
        print(f"time_conv {c} @ 4x{h}x{w}: self-check {exact}; equal {torch.equal(op()[0], ref()[0])}; reference "
              f"{times[0]:.3f} ms, op {times[1]:.3f} ms")
