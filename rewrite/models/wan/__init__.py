"""The Wan 2.1 / 2.2 family (diffusers `AutoencoderKLWan`): builders, capture, runner, frame loop, streaming,
ops and references, the chain pass and the sharded decode. `build_wan` and `wan_config` are importable from
here, as before the tree had a folder per family."""

from rewrite.models.wan.config import build_wan, wan_config  # noqa: F401  (the public path of the builders)
