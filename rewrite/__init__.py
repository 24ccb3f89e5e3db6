"""Graph-rewriting optimizer for video and audio VAE decoders.

    from rewrite import optimize, report
    vae = optimize(vae, level="lossless")   # "off" | "lossless" (default) | "channels_last"

The entry points load `rewrite.api` on first use, so that importing a subpackage (`rewrite.ops`,
`rewrite.engine`, ...) does not load the API, the passes and the runtime behind it.
"""

import importlib

from rewrite.levels import LEVELS

__all__ = ["LEVELS", "optimize", "report", "stream", "warmup"]
_API = ("optimize", "report", "warmup", "stream")



def __getattr__(name: str):
    if name in _API:
        api = importlib.import_module("rewrite.api")
        globals().update({entry: getattr(api, entry) for entry in _API})
        return globals()[name]
    raise AttributeError(f"module 'rewrite' has no attribute {name!r}")
