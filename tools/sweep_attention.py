"""Time the Triton flash-attention kernel (`rewrite.kernels.attention.attention`) against `scaled_dot_product_attention`
for Wan 2.1's middle-block attention (one head of dim 384; 720p and 480p latents), per tile.

Each run reports ms (``triton.testing.do_bench_cudagraph``: median GPU time), TFLOP/s (4 * L * L * D) and the
max-abs difference against an fp32 reference; the table `attention_fast._FASTER_THAN_SDPA` and
`triton_attention.launch_config` are read from it (docs/tuning.md section 1.13). Needs CUDA (``--help`` works
anywhere).

    python -m rewrite.tools.sweep_attention [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

# (name, tokens, head dim)
SHAPES = [("720p 1 x 14400 x 384", 14400, 384), ("480p 1 x 6240 x 384", 6240, 384)]
# AttentionTile fields: block_m, block_n, warps, stages
TILES = [(64, 32, 8, 2), (64, 32, 8, 3), (64, 64, 8, 1), (64, 16, 8, 3), (64, 64, 8, 2), (128, 32, 8, 2)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    import torch
    import torch.nn.functional as F
    import triton.testing

    from rewrite.kernels.attention import attention as triton_attention

    if not torch.cuda.is_available():
        print("sweep_attention: needs CUDA", file=sys.stderr)
        return 2
    results = []
    for name, tokens, d in SHAPES:
        torch.manual_seed(0)
        q, k, v = torch.randn(1, 1, tokens, 3 * d, device="cuda", dtype=torch.bfloat16).chunk(3, dim=-1)
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        flops = 4 * tokens * tokens * d
        ms = triton.testing.do_bench_cudagraph(lambda: F.scaled_dot_product_attention(q, k, v))
        err = (F.scaled_dot_product_attention(q, k, v).float() - reference).abs().max().item()
        row = {"shape": name, "sdpa_ms": ms, "sdpa_max_abs": err, "tiles": []}
        print(f"{name:<24} sdpa {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  max-abs {err:.3g}", flush=True)
        for fields in TILES:
            tile = triton_attention.AttentionTile(*fields)
            try:
                out = triton_attention.attention(q, k, v, tile)
                err = (out.float() - reference).abs().max().item()
                ms = triton.testing.do_bench_cudagraph(lambda tile=tile: triton_attention.attention(q, k, v, tile))
            except Exception as error:  # noqa: BLE001 - a tile this Triton cannot compile: say so and go on
                print(f"  {fields} failed: {type(error).__name__}: {str(error)[:200]}", flush=True)
                row["tiles"].append({"tile": list(fields), "error": f"{type(error).__name__}: {str(error)[:200]}"})
                continue
            print(f"  {str(fields):<24} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  max-abs {err:.3g}", flush=True)
            row["tiles"].append({"tile": list(fields), "ms": ms, "tflops": flops / ms / 1e9, "max_abs": err})
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dtype": "bfloat16", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
