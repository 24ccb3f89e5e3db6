"""Issue 39, a first probe (CPU): the Wan encoder captured as two step graphs with explicit caches, as the decoder
is, and what the decoder's `lossless` and `channels_last` patterns already match in them.

The encoder's chunk loop (`AutoencoderKLWan._encode`) runs the first frame, then 4 frames a chunk. Its cache
slots: one per causal conv (the last 2 frames of its input; 1 after the first chunk) and one per downsampler
`time_conv` (the last frame of its input; the first chunk stores its whole 1-frame input and skips the conv).
The chunk-0 step returns the caches in steady form: a causal conv's 1-frame cache with a zero frame before it
(the conv pads that zero frame anyway, and the next cache reads only the last frame: the same values), a
`time_conv` cache as it is. The steady step takes and returns them. Each step is checked against diffusers'
own loop (`torch.equal`, fp32 and bf16) before its graphs are rewritten.

    python docs/data/experiments/wan_encoder_capture_probe.py [wan2.1|wan2.2] [tiny|full]
"""
import collections
import sys

import torch

from rewrite import supported
from rewrite.capture.export import concrete_shape, export_step, tracing_copy
from rewrite.pipeline import rewrite_graph

model_name = sys.argv[1] if len(sys.argv) > 1 else "wan2.1"
config = sys.argv[2] if len(sys.argv) > 2 else "tiny"


# The step modules began here and moved, as they were, to rewrite/models/wan/encoder_capture.py (session 26).
from rewrite.models.wan.encoder_capture import WanEncoderChunk0Step as EncoderChunk0Step  # noqa: E402
from rewrite.models.wan.encoder_capture import WanEncoderSteadyStep as EncoderSteadyStep  # noqa: E402


def reference_encode(vae, x):
    with torch.no_grad():
        return vae._encode(x)


def stepped_encode(vae, x, chunk0, steady):
    frames = x.shape[2]
    outs, caches = [], None
    with torch.no_grad():
        out, *caches = chunk0(x[:, :, :1])
        outs.append(out)
        for i in range(1, 1 + (frames - 1) // 4):
            out, *caches = steady(x[:, :, 1 + 4 * (i - 1): 1 + 4 * i], caches)
            outs.append(out)
        return vae.quant_conv(torch.cat(outs, 2))


torch.manual_seed(0)
vae = supported.get(model_name).build(config)
if vae.config.patch_size is not None:
    print("patchified encoder (Wan 2.2): the probe feeds the patchified video")
encoder = tracing_copy(vae.encoder)
chunk0, steady = EncoderChunk0Step(encoder), EncoderSteadyStep(encoder)
in_channels = encoder.conv_in.in_channels
for dtype in (torch.float32, torch.bfloat16):
    vae_d = vae.to(dtype)
    x = torch.randn(2, in_channels, 9, 32, 48, generator=torch.Generator().manual_seed(1)).to(dtype)
    if vae.config.patch_size is None:
        ref, mine = reference_encode(vae_d, x), stepped_encode(vae_d, x, chunk0, steady)
        print(f"{dtype}: eager steps torch.equal to diffusers' _encode: {torch.equal(mine, ref)}")
vae = vae.float()

x1 = torch.zeros(2, in_channels, 1, 32, 48)
g0 = export_step("encode_chunk0", chunk0, (x1,), dynamic_dims=(0, 3, 4), strip_prefix="encoder.")
output = next(n for n in g0.graph_module.graph.nodes if n.op == "output")
caches = [torch.zeros(concrete_shape(n.meta["val"])) for n in output.args[0][1:]]
print("cache slots:", collections.Counter(tuple(c.shape[1:3]) for c in caches))
g1 = export_step("encode_steady", steady, (torch.zeros(2, in_channels, 4, 32, 48), caches), dynamic_dims=(0, 3, 4),
                 strip_prefix="encoder.")
import copy

rewritten = {}
for level in ("lossless", "channels_last"):
    for graph in (g0, g1):
        g = copy.deepcopy(graph)
        rewritten[level, graph.name] = g
        before = collections.Counter(str(n.target) for n in g.graph_module.graph.nodes if n.op == "call_function")
        rewrite_graph(g, level)
        after = collections.Counter(str(n.target) for n in g.graph_module.graph.nodes if n.op == "call_function")
        aten_left = {k: v for k, v in after.items() if k.startswith("aten.") and v}
        matched = {k: v for k, v in g.matches.items() if v}
        print(f"== {level} {g.name}: {sum(before.values())} calls -> {sum(after.values())}; matches {matched}")
        print("   ATen ops left:", dict(sorted(aten_left.items(), key=lambda kv: -kv[1])[:14]))
        declined = {k: dict(list(v.items())[:2]) for k, v in g.declined.items()}
        if declined:
            print("   declined:", declined)

# the rewritten lossless graphs run over the encoder's weights, against diffusers' _encode (fp32, CPU)
r0, r1 = rewritten["lossless", "encode_chunk0"], rewritten["lossless", "encode_steady"]
x = torch.randn(2, in_channels, 9, 32, 48, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    out, *caches = r0(r0.weights(vae.encoder), x[:, :, :1])
    outs = [out]
    for i in range(1, 3):
        out, *caches = r1(r1.weights(vae.encoder), x[:, :, 1 + 4 * (i - 1): 1 + 4 * i], *caches)
        outs.append(out)
    rewritten_encode = vae.quant_conv(torch.cat(outs, 2))
print("rewritten lossless graphs (fp32, CPU) torch.equal to diffusers' _encode:",
      torch.equal(rewritten_encode, reference_encode(vae, x)))
