"""`optimize(module, level)` and `report(module)`: the library's entry points.

`optimize` returns the module it was given, with its decode running through captured and rewritten graphs
(see `rewrite.models.wan.runner` and `rewrite.models.auk.runner` for what is installed on the instance). Calling it again re-configures the same
object; `level="off"` removes everything `optimize` installed, leaving the module as diffusers made it.
"""

from __future__ import annotations

import difflib
import logging
import sys

import torch
from torch import nn

from rewrite.levels import LEVELS, check_level
from rewrite.pipeline import rewrite_graph
from rewrite.reporting import Report, WarmupResult
from rewrite.runtime.runner import installed_runner
from rewrite.supported import SupportedModel, model_for

logger = logging.getLogger("rewrite")


def optimize(module: nn.Module, level: str = "lossless", *, group=None, output: str | None = None,
             **options) -> nn.Module:
    """Rewrite `module`'s decoder at `level` ("off", "lossless" (default), "channels_last").

    Returns the same object. Parameters stay the same tensor objects and `state_dict()` is unchanged.
    Wan only: `group=` a `torch.distributed` ProcessGroup or a 1-D DeviceMesh makes `module.decode(z)` a
    collective of that group's ranks (`rewrite.models.wan.distributed.decode_sharded`, `output=` "all" (default),
    "rank0" or "band" as there; `rewrite.models.wan.distributed.sharding`); a later call without `group=` (or at
    "off") makes it a local decode again.
    `options` go to the model's runner: for `AuKVAE`, `compile_shapes` (buckets in latent frames, default
    (160, 320, 640)), `tile_frames` (default the largest bucket), `max_graphs` (exact-length CUDA graphs
    kept before the generation is retired, default 8) and `cudnn_benchmark` (channels_last only: cuDNN times
    its algorithms during capture, default False). Both models: `cache_dir`, a directory where the rewritten
    graphs and the self-check verdicts are kept for later processes (`rewrite.runtime.disk_cache`; default
    None: the ``REWRITE_CACHE_DIR`` environment variable, off when unset; False: off).
    Raises TypeError for an unsupported module, an option the model does not take (naming the options it takes
    at that level and the close matches) or a `group=` that is no ProcessGroup or DeviceMesh, ValueError for an
    unknown level, a bad option value or a mesh that is not 1-D; the module is unchanged when it raises.
    """
    check_level(level)
    model = model_for(module)
    runner_class = model.runner_class()
    _check_option_names(model, runner_class, level, options)  # before anything is built or installed
    sharding = _sharding_for(module, _shards(model, runner_class), level, group, output)
    # Built first: a bad option value raises before anything installed is touched (at "off" too: an option
    # misspelt there would be one misspelt at the other levels).
    runner = runner_class(module, LEVELS[-1] if level == "off" else level, rewrite_graph, **options)
    if level == "off":
        runner = None
    fresh = _install_runner(module, runner_class, runner, options)
    _set_sharding(module, sharding)
    if fresh or sharding is not None:
        logger.info("%s optimized at level %r%s", type(module).__name__, level,
                    "" if sharding is None else f", decode sharded (output={sharding.output!r})")
    return module


#: `optimize`'s own options of a sharded decode (Wan only), with the levels where they act
_SHARDING_OPTIONS = {"group": ("lossless", "channels_last"), "output": ("lossless", "channels_last")}


def accepted_options(model: SupportedModel, runner_class: type) -> dict[str, tuple[str, ...]]:
    """The options `optimize` takes for `model` (driven by `runner_class`), by name: the levels where each
    acts. The runner's `OPTIONS` (its test hooks, `HIDDEN_OPTIONS`, are accepted but not listed) and, for
    Wan, `group` and `output`."""
    options = dict(runner_class.OPTIONS)
    if _shards(model, runner_class):
        options.update(_SHARDING_OPTIONS)
    return options


def _shards(model: SupportedModel, runner_class: type) -> bool:
    """Whether `group=` may shard this model's decode: a Wan-family model whose runner does not opt out
    (`shards = False`: Qwen-Image's, whose decoder the band forwards were not written for)."""
    return model.family == "wan" and getattr(runner_class, "shards", True)


def _check_option_names(model: SupportedModel, runner_class: type, level: str, options: dict) -> None:
    """A TypeError naming `optimize`, the option(s) it does not take, the close matches and the options it
    takes for this model at this level, raised before anything is built or installed."""
    accepted = accepted_options(model, runner_class)
    unknown = [name for name in options if name not in accepted and name not in runner_class.HIDDEN_OPTIONS]
    if not unknown:
        return
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name, list(accepted), n=2)
        named.append(f"{name!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""))
    what = model.type_name + (f" ({model.label})" if model.label else "")
    acting = sorted(name for name, levels in accepted.items() if level in levels)
    other = sorted(set(accepted) - set(acting))
    if level == "off":
        takes = f"it takes {', '.join(other)} (none acts at level 'off')"
    else:
        takes = f"at level {level!r} it takes {', '.join(acting)}"
        if other:
            elsewhere = sorted({lv for name in other for lv in accepted[name]})
            takes += (f"; also {', '.join(other)}, which act at level {' or '.join(map(repr, elsewhere))} only")
    raise TypeError(f"optimize() got {'an unexpected option' if len(unknown) == 1 else 'unexpected options'} "
                    f"{', '.join(named)} for {what}: {takes}")


def _sharding_for(module: nn.Module, shardable: bool, level: str, group, output):
    """`rewrite.models.wan.distributed.sharding.sharding_for`; None, importing nothing, without `group=` or `output=`."""
    if group is None and output is None:
        return None
    from rewrite.models.wan.distributed.sharding import sharding_for

    return sharding_for(module, shardable, level, group, output)


def _set_sharding(module: nn.Module, sharding) -> None:
    """`rewrite.models.wan.distributed.sharding.set_sharding`, imported only where it has something to do (a sharding
    to install, or an instance `decode`, its `ENTRY_POINT`, that may be one to remove)."""
    if sharding is not None or "decode" in module.__dict__:
        from rewrite.models.wan.distributed.sharding import set_sharding

        set_sharding(module, sharding)


def _install_runner(module: nn.Module, runner_class: type, runner, options: dict) -> bool:
    """Install `runner` (None: none) in place of the module's runner, keeping the previous one where it is
    configured the same (its graphs captured so far). Whether `runner` itself was installed."""
    previous = installed_runner(module)
    if previous is not None:
        runner_class.uninstall(module)
        if runner is not None and _same_configuration(previous, runner, options):
            previous.install(module)  # keep the graphs captured so far
            return False
    if runner is None:
        return False
    runner.install(module)
    return True


def _same_configuration(previous, runner, options: dict) -> bool:
    """Whether `runner`, just built from this call's `options`, is configured as `previous` is.

    Compares the runners' normalised options (defaults filled in, e.g. sorted buckets), so that a call
    without options means the defaults; an option a runner does not record (a graph backend) never matches.
    """
    recorded = getattr(runner, "options", {})
    return previous.level == runner.level and getattr(previous, "options", {}) == recorded and set(options) <= set(recorded)


def warmup(module: nn.Module, device=None, dtype=None, batch: int = 1, **shapes) -> WarmupResult:
    """Capture ahead of time the graphs `optimize(module, ...)` would capture on first use.

    `device`/`dtype` default to the parameters'. AuK: `frames=[...]` exact lengths in latent frames
    (default: every bucket at `channels_last`, nothing more at `lossless`). Wan: `shapes=[(latent_h,
    latent_w), ...]` (without it only the step graphs are captured) and `frames=` the latent frame count(s)
    of the later decodes (1: chunk 0's CUDA graph alone; on CUDA their output memory is reserved);
    `encode_shapes=[(height, width), ...]` (video pixels) and `encode_frames=` the same for `vae.encode`. Returns
    what it captured, how long it took and what each stage cost (`WarmupResult.breakdown`). Raises
    TypeError/ValueError for bad sizes, RuntimeError when the module is not optimized or the graphs cannot
    serve that dtype/device.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"warmup expects an optimized module; got {type(module).__name__}")
    runner = installed_runner(module)
    if runner is None:
        raise RuntimeError(f"warmup: {type(module).__name__} is not optimized (call rewrite.optimize first)")
    parameter = next(module.parameters())
    device = torch.device(device) if device is not None else parameter.device
    return runner.warmup(device, dtype if dtype is not None else parameter.dtype, batch=batch, **shapes)


def stream(module: nn.Module, *, height: int, width: int, batch: int = 1, dtype=None, device=None):
    """A streaming decode session of an optimized Wan VAE for latents [batch, z_dim, t, height, width]
    (latent sizes; `dtype`/`device` default to the parameters'): `session.push(z_chunk) -> frames`,
    `session.reset()`, `session.close()` or a `with` block. The pushes of a clip concatenated are
    `torch.equal` to decoding the whole clip (`rewrite.models.wan.stream.StreamSession` says where that is
    checked). Raises TypeError for a module that is not an optimized Wan VAE, ValueError for bad sizes."""
    from rewrite.models.wan.stream import StreamSession

    return StreamSession(module, batch=batch, height=height, width=width, dtype=dtype, device=device)


def report(module: nn.Module) -> Report:
    """What `optimize` did to `module`: graphs (nodes, capture time, matches), fallbacks, the last path, what the
    captures cost per graph and stage (`Report.first_call`) and what the disk cache served."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"report expects a module (an optimized decoder); got {type(module).__name__}")
    runner = installed_runner(module)
    if runner is None:
        return Report(type(module).__name__, "off", [], {}, "reference", "not optimized")
    return Report(
        model=type(module).__name__,
        level=runner.level,
        graphs=runner.graph_reports(),
        fallbacks=dict(runner.fallbacks.counts),
        last_path=runner.fallbacks.last_path,
        last_reason=runner.fallbacks.last_reason,
        last_detail=runner.fallbacks.last_detail,
        cuda_graphs=runner.cuda_graph_counts(),
        graph_memory=runner.graph_memory(),
        first_call=runner.timings.records(),
        disk_cache=runner.disk_cache_summary(),
        band_graphs=_band_graph_lines(runner),
    )


def _band_graph_lines(runner) -> list[str]:
    """The band graphs a sharded decode captured for this runner; none where no sharded decode ran in this
    process (its module is then not loaded, and `report` does not load it)."""
    band_graphs = sys.modules.get("rewrite.models.wan.distributed.band_graphs")
    return [] if band_graphs is None else band_graphs.describe(runner)
