"""`rewrite.models.wan.distributed.decode_sharded` over gloo: 2 and 3 ranks spawned from pytest, tiny Wan 2.1 / 2.2.

Each spawn runs many cases in its ranks (start-up, ~8 s a spawn on 2 cores, dominates) and each rank
writes what it saw; one test per spawn asserts every case (so pytest-xdist never runs a spawn twice). The
single-process reference is decoded inside the ranks, under the same thread count as the sharded decode.
"""

from __future__ import annotations

import pytest
import torch

from tests.models.wan.distributed.ranks import _spawn


def test_checksum_is_order_free_and_names_a_change():
    from rewrite.models.wan.distributed.decode import _checksum

    t = torch.randn(1000)
    assert [int(v) for v in _checksum(t)] == [int(v) for v in _checksum(t.clone())]
    u = t.clone()
    u[3], u[4] = t[4], t[3]  # a swap keeps the plain sum, not the weighted one
    assert _checksum(u)[0] == _checksum(t)[0] and _checksum(u)[1] != _checksum(t)[1]


def _check_graphs(results, world, frames):
    """Each band-graph case served from its graphs as `_graph_case` says (or refused them on every rank)."""
    problems = []
    for name in results[0]:
        if "band graph" not in name or name.endswith(("failure", "1-frame clips")):
            continue
        for rank in range(world):
            status, value = results[rank][name]
            if status != "ok":
                continue  # reported by _check_decodes
            calls, n = value["calls"], frames.get(name)
            if "refused" in name:
                why = "the band graphs differ from the eager band mode at step 1 (steady) on some rank"
                expected = [(2, 2, why, 0)] + [(0, 0, why, 0)] * 2
            elif "on gloo" in name:
                why = "gloo collectives cannot run inside a CUDA graph (cuda_graphs='whole' needs NCCL)"
                expected = [(n, 3, None, 0)] + [(n, 0, why, 0)] * 3
            elif "captures off" in name:
                expected = [(n, 3, None, 0)] + [(n, 0, None, 0)] * 3
            elif "segments" in name or "whole steps" in name:
                expected = [(n, 3, None, 0), (n, 3, None, n), (n, 0, None, n), (n, 3, None, n)]
                if "whole steps" in name and value["captures"] != 4:  # one graph per step, captured twice
                    problems.append(f"{name}, rank {rank}: {value['captures']} captures, expected 4")
            else:
                expected = [(n, 3, None, 0), (n, 0, None, 0), (n, 0, None, 0)]
            seen = [(c["steps"], c["checks"], c["reason"], c["replays"]) for c in calls]
            state = ("graphs refused" if "refused" in name else
                     "captured steps segments: serving" if "segments" in name else
                     "captured steps whole: serving" if name.startswith("wan2.1 band graph whole steps b1") else
                     "graphs serving, 8 of 56 conv calls gathered" if "gathered convs" in name else
                     "graphs serving, 0 of ")
            if f"rank {rank} of {world}, latent rows" not in value["report"] or state not in value["report"]:
                problems.append(f"{name}, rank {rank}: the report does not say {state!r}: {value['report']}")
            if seen != expected:
                problems.append(f"{name}, rank {rank}: (graph steps, checks, reason, replays) per call {seen}, "
                                f"expected {expected}")
            gathered = [c["gathered convs"] for c in calls if c["steps"]]
            if gathered != [8 if "gathered convs" in name else 0] * len(gathered):
                problems.append(f"{name}, rank {rank}: gathered conv calls per call {gathered}")
    return problems


def _check_decodes(results, world):
    problems = []
    for name in results[0]:
        if name.startswith(("mismatch", "optimize")) or name.endswith(("failure", "1-frame clips")):
            continue
        for rank in range(world):
            status, value = results[rank][name]
            if status != "ok":
                problems.append(f"{name}, rank {rank}: {value}")
                continue
            if not value["equal"] or not value["module_unchanged"]:
                problems.append(f"{name}, rank {rank}: {value}")
            expected = ("single-process" if "single-process" in name else "tiles" if "tiled" in name
                        else "bands")
            if value["mode"] != expected:
                problems.append(f"{name}, rank {rank}: mode {value['mode']} ({value['reason']}), expected {expected}")
            if expected == "bands" and value["local"] == 0:
                problems.append(f"{name}, rank {rank}: no op ran band-locally")
    return problems


@pytest.mark.slow  # ~90-270 s: two spawned ranks through ~20 full decodes
def test_two_ranks(tmp_path):
    results = _spawn(2, "two", tmp_path)
    problems = _check_decodes(results, 2)
    tiles = [results[r]["wan2.1 tiled f2 7x8"][1]["tiles"] for r in range(2)]
    assert tiles == [[(0, 0), (0, 6), (3, 3), (6, 0), (6, 6)], [(0, 3), (3, 0), (3, 6), (6, 3)]], tiles
    for rank in range(2):
        messages = {k: results[rank][k] for k in ("mismatch latents", "mismatch weights", "mismatch shape")}
        for key, needle in (("mismatch latents", "the latents (rank 0 differs from rank 1)"),
                            ("mismatch weights", "decoder.up_blocks.1.resnets.0.conv2.weight"),
                            ("mismatch shape", "the latent shape (rank 0: (1, 4, 1, 4, 4), rank 1: (1, 4, 1, 4, 5))")):
            status, value = messages[key]
            if status != "ok" or not value["raised"] or needle not in value["raised"]:
                problems.append(f"{key}, rank {rank}: expected a ShardMismatchError naming {needle!r}; got {value}")
    problems += _check_optimize(results, 2)
    problems += _check_graphs(results, 2, {"wan2.1 band graphs b1 f4 5x6": 4, "wan2.2 band graphs b1 f3 5x6": 3,
                                           "wan2.1 band graphs gathered convs b1 f3 5x6": 3,
                                           "wan2.2 band graph segments b1 f3 5x6": 3,
                                           "wan2.1 band graph whole steps b1 f3 4x4": 3,
                                           "wan2.1 band graph captures off b1 f3 4x4": 3,
                                           "wan2.1 band graph whole steps on gloo b1 f3 4x4": 3})
    for rank in range(2):
        status, value = results[rank]["band graphs of 1-frame clips"]
        # (equal, graph steps, checks, eager band ops ran) per call
        if status != "ok" or value != [(True, 1, 1, True), (True, 1, 0, False), (True, 3, 2, True)]:
            problems.append(f"band graphs of 1-frame clips, rank {rank}: {status} {value}")
        status, value = results[rank]["band graph failure"]
        if rank == 1:
            expected = status == "ok" and value["type"] == "RuntimeError" and "injected failure" in value["message"]
        else:
            expected = (status == "ok" and value["type"] == "PeerFailedError" and 2.5 < value["seconds"] < 10
                        and "rank 1 failed: RuntimeError: injected failure in a band graph" in value["message"])
        if not expected or (status == "ok" and value["checked"] != 3):
            problems.append(f"band graph failure, rank {rank}: {status} {value}")
    assert not problems, "\n".join(problems)


#: what `optimize` says for each bad call of `_optimize_case`
OPTIMIZE_ERRORS = {
    "string": "TypeError: optimize: group= must be a torch.distributed ProcessGroup or a 1-D DeviceMesh; got str",
    "2-D mesh": "ValueError: optimize: group= takes a 1-D DeviceMesh; got one of 2 dimensions (1, 2)",
    "output": "ValueError: optimize: output must be one of 'all', 'rank0', 'band'; got 'rows'",
    "off": "ValueError: optimize: level 'off' leaves the module as diffusers made it",
    "auk": "TypeError: optimize: group= is for the Wan VAE (diffusers AutoencoderKLWan); got AuKVAE",
}


def _check_optimize(results, world):
    problems = []
    for version in ("wan2.1", "wan2.2"):
        for rank in range(world):
            status, seen = results[rank][f"optimize group= {version}"]
            if status != "ok":
                problems.append(f"optimize group= {version}, rank {rank}: {seen}")
                continue
            errors = seen.pop("errors")
            if not all(seen.values()):
                problems.append(f"optimize group= {version}, rank {rank}: {seen}")
            for name, needle in OPTIMIZE_ERRORS.items():
                if not errors[name].startswith(needle):
                    problems.append(f"optimize group= {version}, rank {rank}, {name}: {errors[name]!r}")
    return problems


@pytest.mark.slow  # three spawned ranks
def test_three_ranks_and_a_failing_rank(tmp_path):
    results = _spawn(3, "three", tmp_path)
    problems = _check_decodes(results, 3)
    problems += _check_graphs(results, 3, {"wan2.1 band graph segments b1 f3 7x6": 3})
    for rank in range(3):
        status, value = results[rank]["failure"]
        assert status == "ok", value
        if rank == 1:
            assert value["type"] == "RuntimeError" and "injected failure on rank 1" in value["message"], value
        else:
            assert value["type"] == "PeerFailedError", value
            assert "rank 1 failed: RuntimeError: injected failure on rank 1" in value["message"], value
            assert 2.5 < value["seconds"] < 60, value  # the 3 s wait timeout (plus a loaded machine's delays), not the 300 s hang
    assert not problems, "\n".join(problems)


@pytest.mark.gpu
@pytest.mark.parametrize("version, size", [("wan2.1", "60x104"), ("wan2.1", "90x160"), ("wan2.2", "30x52"),
                                           ("wan2.2", "45x80")], ids=("wan2.1-480p", "wan2.1-720p",
                                                                      "wan2.2-480p", "wan2.2-720p"))
def test_gpu_two_gloo_ranks_on_one_device(tmp_path, version, size):
    """Two ranks on cuda:0 over gloo (CUDA tensors staged through host memory): full-size bf16 decoders,
    3 latent frames (chunk 0 and two steady steps), `torch.equal` to the single-process decode and to
    `lossless`; prints what ran on the band, what was gathered and why."""
    name = f"gpu {version} {size} 3"
    results = _spawn(2, name, tmp_path, limit=600)
    problems = _check_decodes(results, 2)
    for rank in range(2):
        status, value = results[rank][f"{name} rank0"]
        print(f"rank {rank}:", value)
        if status == "ok" and not value["equal_lossless"]:
            problems.append(f"rank {rank}: the sharded decode differs from lossless, or the band graph segments did "
                            f"not serve the third call: {value['graph calls']}")
    assert not problems, "\n".join(problems)
