"""Qwen-Image's VAE (diffusers `AutoencoderKLQwenImage`): Wan 2.1's blocks under other class names, served by the
Wan family's capture, patterns, kernels and runner (`config.py` says how its classes map, `runner.py` how it
runs)."""

#: the families whose public pieces this one uses (tests/test_dependencies.py allows these imports and no others)
BUILT_ON = ("wan",)
