"""Graph-rewriting optimizer for video and audio VAE decoders.

    from rewrite import optimize, report
    vae = optimize(vae, level="lossless")   # "off" | "lossless" (default) | "channels_last"
"""

from rewrite.api import optimize, report, warmup
from rewrite.levels import LEVELS

__all__ = ["optimize", "report", "warmup", "LEVELS"]
