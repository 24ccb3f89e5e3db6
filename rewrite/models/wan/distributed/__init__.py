"""Multi-process Wan decode over `torch.distributed`, bit-identical to the single-process decode.

`decode_sharded(vae, z, group=..., output="all" | "rank0" | "band")` splits the latent rows into one band
per rank (halo rows exchanged before each spatial conv, the middle block's attention on its gathered
input), or spreads diffusers' tiles over the ranks where tiling is enabled. How it works, how to launch it
and what is verified: docs/distributed.md.
"""

from rewrite.models.wan.distributed.bands import split_rows
from rewrite.models.wan.distributed.comm import (
    CollectiveError,
    DistributedDecodeError,
    PeerFailedError,
)
from rewrite.models.wan.distributed.decode import (
    ShardedInfo,
    ShardMismatchError,
    decode_sharded,
    output_rows,
)

__all__ = [
    "CollectiveError", "DistributedDecodeError", "PeerFailedError", "ShardMismatchError", "ShardedInfo",
    "decode_sharded", "output_rows", "split_rows",
]
