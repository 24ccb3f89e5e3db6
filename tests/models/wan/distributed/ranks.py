"""The spawned gloo ranks of the sharded-decode tests (`test_decode_sharded.py`): the cases each rank runs
(tiny Wan 2.1 / 2.2), the worker that runs them and writes what it saw, and `_spawn`, which starts the ranks
and reads their results back. Also `StandInSegments`, the CPU stand-in for the band graph segments' capture.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import traceback

import pytest
import torch
import torch.multiprocessing as mp


SPAWN_LIMIT_S = 1200  # a hang guard: the two-rank cases take 90 s on an idle 2-core machine, 270 s on a loaded one


# ---- spawned ranks ------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _latents(vae, batch, frames, height, width, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((batch, vae.config.z_dim, frames, height, width), generator=g).to(dtype)


def _vae(version, dtype):
    from rewrite.models.wan.config import build_wan

    return build_wan(version, "tiny").to(dtype)


def _decode_case(version, dtype, batch, frames, height, width, output="all", tiling=False, slicing=False,
                 optimized=False):
    def case(rank, world):
        from rewrite import optimize
        from rewrite.models.wan.distributed import decode_sharded

        vae = _vae(version, dtype)
        reference = _vae(version, dtype)
        for v in (vae, reference):
            if tiling:
                r = v.spatial_compression_ratio
                v.enable_tiling(tile_sample_min_height=4 * r, tile_sample_min_width=4 * r,
                                tile_sample_stride_height=3 * r, tile_sample_stride_width=3 * r)
            if slicing:
                v.enable_slicing()
        if optimized:
            optimize(vae, "lossless")  # captures nothing until its own decode: the sharded decode uses a copy
        before = {name for name, m in vae.named_modules() if m.__dict__.get("forward") is not None}
        z = _latents(vae, batch, frames, height, width, dtype, seed=frames * 10 + batch)
        with torch.no_grad():
            video, info = decode_sharded(vae, z, output=output, return_info=True)
            expected = reference.decode(z).sample
        after = {name for name, m in vae.named_modules() if m.__dict__.get("forward") is not None}
        if output == "all" or (output == "rank0" and rank == 0):
            equal = video is not None and video.shape == expected.shape and torch.equal(video, expected)
        elif output == "rank0":
            equal = video is None
        else:
            a, b = info.output_rows[rank]
            equal = video.shape[-2] == b - a and torch.equal(video, expected[..., a:b, :])
        return {"equal": bool(equal), "mode": info.mode, "reason": info.reason, "local": info.band_local_ops,
                "gathered": info.gathered_ops, "gathered_reasons": info.gathered_reasons, "tiles": info.tiles,
                "module_unchanged": before == after}
    return case


class StandInSegments:
    """CUDA-graph semantics for the band graph segments on the CPU: a capture runs nothing into its static
    outputs (filled with NaN, as a capture leaves them unwritten); a replay runs the segment on the inputs it
    was captured with and copies into those outputs. So a value read from a wrong buffer shows."""

    def __init__(self):
        self.captures = 0

    def can_capture(self, device):
        return True

    def new_pool(self):
        return None

    def capture(self, fn, inputs, pool):
        self.captures += 1
        outputs = [o.clone().fill_(float("nan")) if o.is_floating_point() else o.clone() for o in fn(*inputs)]

        def replay():
            for static, value in zip(outputs, fn(*inputs)):
                static.copy_(value)
        return replay, outputs


def gloo_cuda_segments():
    """The production capture of the band graphs (`CudaSegments`) claiming it can capture on the CPU: for the
    refusal of cuda_graphs="whole" over gloo, which comes before any capture."""
    from rewrite.models.wan.distributed.band_segments import CudaSegments

    class GlooCudaSegments(CudaSegments):
        can_capture = staticmethod(lambda device: True)
    return GlooCudaSegments()


def _forced_conv_check(rank):
    """A conv check that fails chosen calls as a cuDNN kernel chosen from the band's shape would: on rank 0
    the calls of one residual block's conv1, on rank 1 every resampler's, so the ranks must take the union."""
    from rewrite.models.wan.distributed.band_convs import RESAMPLE_HALO, check_call

    def check(call, *args):
        if (call.module == "decoder.up_blocks.1.resnets.0.conv1") if rank == 0 else call.kind == RESAMPLE_HALO:
            return False, f"{call.describe()}: failed by the test"
        return check_call(call, *args)
    return check


def _graph_case(version, batch, frames, height, width, refuse=False, segments=None, cuda_graphs="segments",
                gather=False):
    """An optimized module's sharded decode through the band graphs (bf16: on this CPU fp32's SiLU depends on
    an element's position, so fp32 band graphs are refused): the first call checks chunk 0 and two steady
    steps against the eager band mode, the second serves from the graphs alone, a third after a weight edit
    (in place, on this module and the reference alike) still from the graphs and equal. `refuse`: rank 1's
    steady graph is made to add 1 to its output, so every rank refuses the pair at step 1 and the eager band
    mode finishes the decode. `segments` (a capture factory: `StandInSegments` or `gloo_cuda_segments`): the band
    graphs captured as `cuda_graphs` says: checked against the band graphs on the second call, replayed alone
    on the third (after the in-place edit), captured and checked again on a fourth after a weight was
    replaced by a new tensor. `gather`: the conv checks fail chosen calls (`_forced_conv_check`), so their
    convs run gathered, the same on every rank."""
    def case(rank, world):
        from rewrite import optimize, report
        from rewrite.models.wan.distributed import decode_sharded
        from rewrite.models.wan.distributed.band_graphs import store_of
        from rewrite.runtime.runner import installed_runner

        bf16 = torch.bfloat16
        vae, reference = optimize(_vae(version, bf16), "lossless"), _vae(version, bf16)
        backend = segments() if segments is not None else None
        if backend is not None:
            store_of(installed_runner(vae)).segment_backend = backend
        if gather:
            store_of(installed_runner(vae)).conv_check = _forced_conv_check(rank)
        if refuse and rank == 1:
            runner = installed_runner(vae)
            rewrite_graph = runner.rewrite_graph

            def broken(graph, level):
                rewrite_graph(graph, level)
                if graph.name == "steady":
                    g = graph.graph_module.graph
                    output = next(n for n in g.nodes if n.op == "output")
                    y = output.args[0][0]
                    with g.inserting_before(output):
                        wrong = g.call_function(torch.ops.aten.add.Tensor, (y, 1.0))
                    output.args = ((wrong, *output.args[0][1:]),)
                    graph.graph_module.recompile()

            runner.rewrite_graph = broken
        z = _latents(vae, batch, frames, height, width, bf16, seed=frames)
        calls = []
        with torch.no_grad():
            expected = reference.decode(z).sample
            for edit in (None, None, "in place") + (("replaced",) if segments is not None else ()):
                for v in (vae, reference) if edit else ():
                    conv = v.decoder.up_blocks[0].resnets[0].conv1
                    if edit == "in place":
                        conv.weight.mul_(1.25)
                    else:
                        conv.weight = torch.nn.Parameter(conv.weight * 0.5)
                if edit:
                    expected = reference.decode(z).sample
                video, info = decode_sharded(vae, z, return_info=True, cuda_graphs=cuda_graphs)
                calls.append({"equal": bool(torch.equal(video, expected)), "mode": info.mode,
                              "steps": info.graph_steps, "checks": info.graph_checks, "reason": info.graph_reason,
                              "replays": info.graph_replays, "gathered convs": info.graph_gathered_convs})
        first = calls[0]
        return {"equal": all(c["equal"] for c in calls), "mode": first["mode"], "reason": None,
                "local": 1, "gathered": 0, "gathered_reasons": [], "tiles": None, "module_unchanged": True,
                "calls": calls, "captures": getattr(backend, "captures", None), "report": str(report(vae))}
    return case


def _one_frame_clips_case(rank, world):
    """1-frame clips (an image): the first checks chunk 0 against the eager band mode, the second runs the
    graphs alone (no eager op: chunk 0 is checked, no steady step to check), a 3-frame clip then checks its
    two steady steps. Each `torch.equal` to the single-process decode."""
    from rewrite import optimize
    from rewrite.models.wan.distributed import decode_sharded

    bf16 = torch.bfloat16
    vae, reference = optimize(_vae("wan2.1", bf16), "lossless"), _vae("wan2.1", bf16)
    seen = []
    with torch.no_grad():
        for frames in (1, 1, 3):
            z = _latents(vae, 1, frames, 4, 4, bf16, seed=frames)
            video, info = decode_sharded(vae, z, return_info=True)
            seen.append((bool(torch.equal(video, reference.decode(z).sample)), info.graph_steps, info.graph_checks,
                         info.band_local_ops > 0))
    return seen


def _mesh_case(rank, world):
    """`group=` a 1-D DeviceMesh (its own process group: its own verdicts)."""
    from torch.distributed.device_mesh import init_device_mesh

    from rewrite.models.wan.distributed import decode_sharded

    mesh = init_device_mesh("cpu", (world,))
    vae = _vae("wan2.1", torch.bfloat16)
    z = _latents(vae, 1, 2, 4, 4, torch.bfloat16)
    with torch.no_grad():
        video, info = decode_sharded(vae, z, group=mesh, return_info=True)
        expected = vae.decode(z).sample
    return {"equal": bool(torch.equal(video, expected)), "mode": info.mode, "reason": info.reason,
            "local": info.band_local_ops, "gathered": info.gathered_ops, "gathered_reasons": [], "tiles": None,
            "module_unchanged": True}


def _mismatch_case(what):
    def case(rank, world):
        from rewrite.models.wan.distributed import ShardMismatchError, decode_sharded

        vae = _vae("wan2.1", torch.float32)
        z = _latents(vae, 1, 1, 4, 4, torch.float32)
        if rank == 1 and what == "latents":
            z[0, 0, 0, 0, 0] += 1e-3
        if rank == 1 and what == "shape":
            z = _latents(vae, 1, 1, 4, 5, torch.float32)
        if rank == 1 and what == "weights":
            with torch.no_grad():
                vae.decoder.up_blocks[1].resnets[0].conv2.weight.view(-1)[7] += 1e-3
        try:
            with torch.no_grad():
                decode_sharded(vae, z)
        except ShardMismatchError as error:
            return {"raised": str(error)}
        return {"raised": None}
    return case


def _fail_on_rank1(owner, name: str, call: int, message: str) -> None:
    """Make `owner.name` (a function or method) raise RuntimeError(message) on its `call`-th call, on rank 1."""
    original, calls = getattr(owner, name), [0]

    def failing(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise RuntimeError(message)
        return original(*args, **kwargs)
    setattr(owner, name, failing)


def _failing_decode(rank, vae, z) -> dict:
    """`decode_sharded(vae, z, timeout=3)`: what it raised (type, message) and after how many seconds. The
    failing rank (1) outlives the others' 3 s waits (so they fail by the timeout, not by its exit); the others
    stay a moment: rank 0 hosts the store that the others read."""
    from rewrite.models.wan.distributed import PeerFailedError, decode_sharded

    start = time.monotonic()
    try:
        with torch.no_grad():
            decode_sharded(vae, z, timeout=3)
        outcome = {"type": None, "message": ""}
    except Exception as error:  # noqa: BLE001
        outcome = {"type": "PeerFailedError" if isinstance(error, PeerFailedError) else type(error).__name__,
                   "message": str(error)}
    outcome["seconds"] = time.monotonic() - start
    time.sleep(6 if rank == 1 else 1.5)
    return outcome


def _failure_case(rank, world):
    """Rank 1 raises in the middle of the decode (its third norm) and stays alive; the others must fail
    with its error within the per-wait timeout, not hang."""
    from rewrite.models.wan.distributed import bands

    vae = _vae("wan2.1", torch.float32)
    z = _latents(vae, 1, 2, 6, 4, torch.float32)
    if rank == 1:
        _fail_on_rank1(bands, "band_norm", 3, "injected failure on rank 1")
    return _failing_decode(rank, vae, z)


def _graph_failure_case(rank, world):
    """Rank 1 raises inside a band graph (its fourth halo exchange of a call the verified graphs serve alone)
    and stays alive; rank 0, waiting in that exchange, must fail with its error within the per-wait timeout."""
    from rewrite import optimize
    from rewrite.models.wan.distributed import decode_sharded
    from rewrite.models.wan.distributed.comm import Comm

    bf16 = torch.bfloat16
    vae = optimize(_vae("wan2.1", bf16), "lossless")
    z = _latents(vae, 1, 3, 4, 4, bf16)
    with torch.no_grad():
        _, info = decode_sharded(vae, z, timeout=3, return_info=True)  # the pair checked: later calls use it alone
    if rank == 1:
        _fail_on_rank1(Comm, "exchange_edges", 4, "injected failure in a band graph on rank 1")
    return {**_failing_decode(rank, vae, z), "checked": info.graph_checks}


def _optimize_case(version, reference_level):
    """`optimize(vae, "lossless", group=...)`: a plain `vae.decode` is the sharded decode (outputs "all" and
    "band"; the runner's `last_path` stays "none" while only the band mode, on a copy of the decoder, ran);
    a call that decode_sharded decodes single-process (autograd on) goes through the class decode and the
    runner; bad groups raise and change nothing; optimizing without group= restores the class decode.
    The reference is the single-process decode at `reference_level`: "lossless" captures its graphs (~8 s
    on 2 cores), "off" (diffusers, which lossless equals) captures nothing."""
    def case(rank, world):
        import copy

        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        from rewrite import optimize, report
        from rewrite.models.wan.distributed import output_rows
        from rewrite.models.wan.distributed.sharding import installed_sharding
        from rewrite.models.auk.model import AuKConfig, AuKVAE
        from rewrite.reporting import FallbackLog

        f32, group = torch.float32, dist.group.WORLD
        reference = optimize(_vae(version, f32), reference_level)
        z = _latents(reference, 1, 2, 5, 4, f32, seed=3)  # one latent size: a new one costs the runner seconds
        seen = {}
        with torch.no_grad():
            expected = reference.decode(z).sample
            vae = copy.deepcopy(reference)  # with its captured graphs: one capture per case at most
            if "_rewrite_runner" in vae.__dict__:
                vae.__dict__["_rewrite_runner"].fallbacks = FallbackLog()  # last_path "none" until the runner runs
            tensors = dict(vae.state_dict(keep_vars=True))
            optimize(vae, "lossless", group=group)
            seen["all"] = torch.equal(vae.decode(z).sample, expected)
            seen["bands ran"] = report(vae).last_path == "none"
            optimize(vae, "lossless", group=group, output="band")
            a, b = output_rows(vae, z.shape[3], world)[rank]
            (band,) = vae.decode(z, return_dict=False)
            seen["band"] = band.shape[-2] == b - a and torch.equal(band, expected[..., a:b, :])
            with torch.enable_grad():  # a guard: single-process, through the class decode and the runner
                seen["single-process"] = torch.equal(vae.decode(z).sample, expected[..., a:b, :])
            seen["through the runner"] = report(vae).last_path == "reference"  # its autograd guard
            errors = {}
            mesh = DeviceMesh("cpu", torch.arange(world).reshape(1, world), _init_backend=False)
            for name, call in (("string", lambda: optimize(vae, "lossless", group="world")),
                               ("2-D mesh", lambda: optimize(vae, "lossless", group=mesh)),
                               ("output", lambda: optimize(vae, "lossless", group=group, output="rows")),
                               ("off", lambda: optimize(vae, "off", group=group)),
                               ("auk", lambda: optimize(AuKVAE(AuKConfig.tiny()), "lossless", group=group))):
                try:
                    call()
                    errors[name] = "no error"
                except (TypeError, ValueError) as error:
                    errors[name] = f"{type(error).__name__}: {error}"
            seen["errors"] = errors
            seen["unchanged by the errors"] = installed_sharding(vae).output == "band"
            optimize(vae, "lossless")
            with torch.set_grad_enabled(reference_level == "off"):  # no graphs captured: the reference path
                seen["plain"] = ("decode" not in vae.__dict__ and vae.decode.__func__ is type(vae).decode
                                 and torch.equal(vae.decode(z).sample, expected))
        seen["same tensors"] = all(t is tensors[k] for k, t in vae.state_dict(keep_vars=True).items())
        return seen
    return case


def _gpu_case(version, height, width, frames):
    """Full-size decoder on CUDA (every rank on cuda:0 over gloo): the sharded decode, eager band mode and
    then band graphs (the module optimized: checked, then their CUDA-graph segments checked, then replayed
    alone), against this process's single-process decode and the `lossless` one; what ran on the band, what
    was gathered, and whether the segments served."""
    def case(rank, world):
        from rewrite import optimize
        from rewrite.models.wan.distributed import decode_sharded
        from rewrite.models.wan.config import build_wan

        torch.cuda.set_device(0)
        vae = build_wan(version, "full").to("cuda", torch.bfloat16).requires_grad_(False)
        z = _latents(vae, 1, frames, height, width, torch.bfloat16).cuda()
        with torch.no_grad():
            start = time.perf_counter()
            video, info = decode_sharded(vae, z, output="rank0", return_info=True)  # eager band mode
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            again = decode_sharded(vae, z, output="rank0")  # verdicts cached: no check runs
            expected = vae.decode(z).sample if rank == 0 else None
            # now the band graphs: checked against the eager band mode on the first call, their CUDA-graph
            # segments captured and checked against them on the second, replayed alone on the third
            optimize(vae, "lossless")
            videos, infos, graph_seconds = [], [], []
            for _ in range(3):
                torch.cuda.synchronize()
                start = time.perf_counter()
                out, call_info = decode_sharded(vae, z, output="rank0", return_info=True)
                torch.cuda.synchronize()
                graph_seconds.append(time.perf_counter() - start)
                videos.append(out)
                infos.append(call_info)
            result = {"mode": info.mode, "reason": info.reason, "local": info.band_local_ops, "seconds": seconds,
                      "gathered": info.gathered_ops, "gathered_reasons": info.gathered_reasons, "tiles": None,
                      "checks": info.checks_run, "module_unchanged": True,
                      "graph calls": [(i.graph_steps, i.graph_replays, i.graph_checks, i.graph_reason) for i in infos],
                      "gathered convs": [i.graph_gathered_convs for i in infos],
                      "graph seconds": graph_seconds}
            served = (infos[2].graph_steps, infos[2].graph_replays, infos[2].graph_checks) == (frames, frames, 0)
            if rank == 0:
                lossless = vae.decode(z).sample
                result["equal"] = all(torch.equal(v, expected) for v in (video, again, *videos))
                result["equal_lossless"] = bool(torch.equal(video, lossless)) and served
            else:
                result["equal"] = all(v is None for v in (video, again, *videos))
                result["equal_lossless"] = served
        return result
    return case


def _cases(name):
    f32, bf16 = torch.float32, torch.bfloat16
    if name.startswith("gpu "):
        _, version, size, frames = name.split()
        height, width = (int(v) for v in size.split("x"))
        return {f"{name} rank0": _gpu_case(version, height, width, int(frames))}
    if name == "two":
        return {
            "wan2.1 fp32 b1 f5 5x6 all": _decode_case("wan2.1", f32, 1, 5, 5, 6),
            "wan2.1 fp32 b1 f1 5x6 band": _decode_case("wan2.1", f32, 1, 1, 5, 6, output="band"),
            "wan2.1 fp32 b1 f1 5x6 rank0": _decode_case("wan2.1", f32, 1, 1, 5, 6, output="rank0"),
            "wan2.1 bf16 b2 f5 4x4 all": _decode_case("wan2.1", bf16, 2, 5, 4, 4),
            "wan2.2 bf16 b2 f1 5x6 all": _decode_case("wan2.2", bf16, 2, 1, 5, 6),
            "wan2.2 fp32 b1 f5 5x4 all": _decode_case("wan2.2", f32, 1, 5, 5, 4),
            "wan2.2 fp32 b1 f1 4x6 band": _decode_case("wan2.2", f32, 1, 1, 4, 6, output="band"),
            "wan2.1 slicing b2 f2 4x4": _decode_case("wan2.1", f32, 2, 2, 4, 4, slicing=True),
            "wan2.1 optimized module f2 4x4": _decode_case("wan2.1", f32, 1, 2, 4, 4, optimized=True),
            "wan2.1 band graphs b1 f4 5x6": _graph_case("wan2.1", 1, 4, 5, 6),
            "wan2.2 band graphs b1 f3 5x6": _graph_case("wan2.2", 1, 3, 5, 6),
            "wan2.1 band graphs refused b1 f3 4x4": _graph_case("wan2.1", 1, 3, 4, 4, refuse=True),
            "wan2.1 band graphs gathered convs b1 f3 5x6": _graph_case("wan2.1", 1, 3, 5, 6, gather=True),
            "wan2.2 band graph segments b1 f3 5x6": _graph_case("wan2.2", 1, 3, 5, 6, segments=StandInSegments),
            "wan2.1 band graph whole steps b1 f3 4x4": _graph_case("wan2.1", 1, 3, 4, 4, segments=StandInSegments,
                                                                   cuda_graphs="whole"),
            "wan2.1 band graph captures off b1 f3 4x4": _graph_case("wan2.1", 1, 3, 4, 4, segments=StandInSegments,
                                                                    cuda_graphs="off"),
            "wan2.1 band graph whole steps on gloo b1 f3 4x4": _graph_case("wan2.1", 1, 3, 4, 4,
                                                                           segments=gloo_cuda_segments,
                                                                           cuda_graphs="whole"),
            "wan2.1 bf16 f2 4x4 on a DeviceMesh": _mesh_case,
            "wan2.1 3 rows, 2 ranks: single-process": _decode_case("wan2.1", f32, 1, 2, 3, 4),
            "wan2.1 tiled f2 7x8": _decode_case("wan2.1", f32, 1, 2, 7, 8, tiling=True),
            "wan2.2 tiled f2 7x8 rank0": _decode_case("wan2.2", f32, 1, 2, 7, 8, tiling=True, output="rank0"),
            "optimize group= wan2.1": _optimize_case("wan2.1", "lossless"),
            "optimize group= wan2.2": _optimize_case("wan2.2", "off"),
            "mismatch latents": _mismatch_case("latents"),
            "mismatch weights": _mismatch_case("weights"),
            "mismatch shape": _mismatch_case("shape"),
            "band graphs of 1-frame clips": _one_frame_clips_case,
            "band graph failure": _graph_failure_case,  # last: it leaves the group with unfinished operations
        }
    return {
        "wan2.1 bf16 b2 f5 7x6 all": _decode_case("wan2.1", bf16, 2, 5, 7, 6),
        "wan2.2 fp32 b1 f1 6x4 band": _decode_case("wan2.2", f32, 1, 1, 6, 4, output="band"),
        "wan2.2 bf16 b1 f5 7x4 all": _decode_case("wan2.2", bf16, 1, 5, 7, 4),
        "wan2.1 tiled f1 7x8": _decode_case("wan2.1", f32, 1, 1, 7, 8, tiling=True),
        "wan2.1 band graph segments b1 f3 7x6": _graph_case("wan2.1", 1, 3, 7, 6, segments=StandInSegments),
        "failure": _failure_case,  # last: it leaves the group with unfinished operations
    }


def _worker(rank, world, port, name, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))  # a rank starved by a loaded machine may wait long
    results = {}
    for case_name, case in _cases(name).items():
        try:
            results[case_name] = ("ok", case(rank, world))
        except Exception as error:  # noqa: BLE001 - reported by the test
            results[case_name] = ("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    os._exit(0)  # the failure case leaves pending operations: no destroy_process_group


def _spawn(world, name, tmp_path, limit=SPAWN_LIMIT_S):
    context = mp.start_processes(_worker, args=(world, _free_port(), name, str(tmp_path)), nprocs=world,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + limit
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail(f"the {world} ranks did not finish within {limit} s (a hang)")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
