"""Full-size Qwen-Image VAE (diffusers `AutoencoderKLQwenImage`, random init) on CUDA at its image sizes.

Images of 1328x1328 and 1664x928 (latents [1, 16, 1, 166, 166] and [1, 16, 1, 116, 208]), bf16: `lossless` is
`torch.equal` to diffusers' decode and `channels_last` within the Wan contract (`rewrite.contract`) against
`off`; both served by the graphs. Timings: `rewrite-bench --model qwenimage --size 1328x1328 --frames 1
--levels off,lossless,channels_last --dtype bfloat16 --repeat 2` (and `--size 1664x928`).
"""

from __future__ import annotations

import pytest
import torch

from rewrite import optimize, report
from rewrite.contract import video_difference
from rewrite.models.qwenimage.config import build_qwenimage

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("height,width", ((1328, 1328), (1664, 928)))
def test_full_size_images(height, width):
    reference = build_qwenimage("full").to("cuda", torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(1, 16, 1, height // 8, width // 8, generator=generator).to("cuda", torch.bfloat16)
    with torch.no_grad():
        expected = reference.decode(z).sample
    for level in ("lossless", "channels_last"):
        vae = optimize(build_qwenimage("full").to("cuda", torch.bfloat16), level=level)
        with torch.no_grad():
            actual = vae.decode(z).sample
        assert report(vae).last_path == "graphs"
        if level == "lossless":
            assert torch.equal(actual, expected)
        else:
            difference = video_difference(actual, expected)
            print(f"{tuple(actual.shape)} {actual.dtype}: {difference}")  # the measured values, kept by `pytest -rA`
            assert difference.violation() is None, f"{difference}: {difference.violation()}"
        del vae
        torch.cuda.empty_cache()
