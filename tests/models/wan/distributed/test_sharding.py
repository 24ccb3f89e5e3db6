"""`rewrite.models.wan.distributed.sharding`, in process: `optimize(group=...)` errors, copies and pickles."""

from __future__ import annotations

import pytest
import torch


def test_optimize_group_errors_copies_and_pickles_in_process():
    """No process group here: a bad `group=`/`output=` raises before the installed runner changes; the
    installed `vae.decode` (set directly, with a stand-in group) survives a deepcopy sharing its group, and
    a pickle refuses it with the remedy."""
    import copy
    import pickle

    from rewrite import optimize
    from rewrite.models.wan.distributed.sharding import Sharding, installed_sharding, set_sharding
    from rewrite.models.wan.config import build_wan

    vae = optimize(build_wan("wan2.1", "tiny"), "lossless")
    runner = vae.__dict__["_rewrite_runner"]
    with pytest.raises(TypeError, match="group= must be a torch.distributed ProcessGroup or a 1-D DeviceMesh"):
        optimize(vae, "channels_last", group="world")
    from rewrite.models.wan.distributed import decode_sharded

    with pytest.raises(ValueError, match="cuda_graphs must be one of segments, whole, off; got 'on'"):
        decode_sharded(vae, torch.zeros(1, 4, 1, 4, 4), cuda_graphs="on")
    with pytest.raises(ValueError, match="output='band' is for a sharded decode; it needs group="):
        optimize(vae, "channels_last", output="band")
    assert vae.__dict__["_rewrite_runner"] is runner and "decode" not in vae.__dict__
    sharding = Sharding(object(), "all")
    set_sharding(vae, sharding)
    twin = copy.deepcopy(vae)
    assert installed_sharding(twin) is sharding and twin.decode.args[0] is twin
    with pytest.raises(TypeError, match=r"cannot be pickled .* without group= first"):
        pickle.dumps(vae)
    optimize(vae, "lossless")
    assert installed_sharding(vae) is None and "decode" not in vae.__dict__
    assert vae.__dict__["_rewrite_runner"] is runner  # the same configuration: the runner is kept
