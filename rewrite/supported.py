"""The models the library supports: one table for `optimize`, `rewrite-debug`, `rewrite-bench` and `rewrite-demo`.

Each `SupportedModel` row says

* how to recognise an instance cheaply: a class is looked up only in a module that is already imported (no
  instance of a class can exist before its module is loaded, and importing diffusers for another model
  would cost seconds: 12 s on the GPU machine's host);
* which runner drives it: a function that imports the runner's module on first use (`runner_class`), so
  that the table imports no runtime;
* how a tool builds a seeded random-init model (`build`: nothing is downloaded) and captures its graphs
  (`capture`), and what the graphs are called and what their symbolic sizes are (`latent_dims`: the
  names of the dims of the graphs' first input).

`runner_class_for(module)` is what `optimize` needs; `get(name)` is what the tools need. `Runner` is the
protocol the runner classes satisfy: what the API calls on them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn

if TYPE_CHECKING:
    from rewrite.capture.export import CapturedGraph
    from rewrite.reporting import FallbackLog, GraphReport, TimingLog, WarmupResult

#: the dtypes the tools accept, by the name they are given on the command line
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: model sizes every row builds: the published geometry and a small one for CPU tests
CONFIGS: tuple[str, ...] = ("full", "tiny")


@runtime_checkable
class Runner(Protocol):
    """What `optimize`, `warmup` and `report` use of the runner installed on a module.

    A runner class is built as ``runner_class(module, level, rewrite_graph, **options)`` (a `TypeError` for
    an option it does not take, a `ValueError` for a bad value) and removed with
    ``runner_class.uninstall(module)``.
    """

    level: str
    options: Mapping[str, Any]  # the options normalised (defaults filled in), compared by a repeated optimize
    fallbacks: FallbackLog
    timings: TimingLog  # what the captures cost, per graph and stage (`report(...).first_call`)

    def install(self, module: nn.Module) -> None: ...

    @classmethod
    def uninstall(cls, module: nn.Module) -> None: ...

    def warmup(self, device: torch.device, dtype: torch.dtype, batch: int = 1, **shapes: Any) -> WarmupResult: ...

    def graph_reports(self) -> list[GraphReport]: ...

    def cuda_graph_counts(self) -> dict[str, int]: ...

    def disk_cache_summary(self) -> str | None: ...


def loaded_class(module_name: str, class_name: str) -> type | None:
    """``module_name.class_name`` if that module is already imported, else None (nothing is imported)."""
    module = sys.modules.get(module_name)
    return getattr(module, class_name, None) if module is not None else None


def _instance_of(module: nn.Module, module_name: str, class_name: str) -> bool:
    cls = loaded_class(module_name, class_name)
    return cls is not None and isinstance(module, cls)


def _cast(module: nn.Module, device: torch.device | None, dtype: torch.dtype | None) -> nn.Module:
    """``module.to(device, dtype)``. A diffusers model whose ``_keep_in_fp32_modules`` is empty gets the plain
    `nn.Module.to`: diffusers' own `to` warns on every dtype cast that modules "should be kept in float32:
    []", naming none."""
    if device is None and dtype is None:
        return module
    cast = module.to if getattr(module, "_keep_in_fp32_modules", None) else nn.Module.to.__get__(module)
    return cast(device=device, dtype=dtype)


# --------------------------------------------------------------------------------------------- rows


@dataclasses.dataclass(frozen=True)
class SupportedModel:
    """One supported model: how to recognise, drive, build and capture it."""

    name: str  # as the tools name it ("wan2.1")
    family: str  # models driven by one runner share it ("wan", "auk")
    type_name: str  # the class users hold, as error messages name it
    label: str | None  # which of the models of that class ("Wan 2.1"), None when the class is the model
    load_runner: Callable[[], type]  # imports and returns the runner class (`runner_class`)
    recognise: Callable[[nn.Module], bool]
    make: Callable[[str, int], nn.Module]  # (config, seed) -> fp32 random-init model, eval mode
    capture_graphs: Callable[..., list[CapturedGraph]]  # (module, dtype, device, **capture options)
    graph_names: tuple[str, ...]  # the names of the captured graphs, in capture order
    latent_dims: tuple[str, ...]  # names of the dims of the graphs' first input
    capture_options: tuple[str, ...] = ()  # keyword options `capture` takes
    meta_capture: bool = False  # captures from a model on the meta device (no weights allocated)

    def runner_class(self) -> type:
        """The runner class (its module imported now, not when the table is)."""
        return self.load_runner()

    def build(self, config: str = "full", *, seed: int = 0, device: torch.device | str | None = None,
              dtype: torch.dtype | None = None) -> nn.Module:
        """A random-init model in eval mode, the same weights for a seed (the caller's RNG state is kept).

        On the meta device the model is built there (no weights allocated); elsewhere it is initialised on
        the CPU and then moved, so a seed gives the same weights on every device.
        """
        if config not in CONFIGS:
            raise ValueError(f"unknown config {config!r}; expected one of {', '.join(CONFIGS)}")
        device = None if device is None else torch.device(device)
        on_meta = device is not None and device.type == "meta"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            with torch.device("meta") if on_meta else contextlib.nullcontext():
                module = self.make(config, seed)
        return _cast(module, None if on_meta else device, dtype)

    def capture(self, module: nn.Module, dtype: torch.dtype, device: torch.device, **options: Any) -> list[CapturedGraph]:
        """The model's graphs for one dtype and device, as the runner captures them (before any pass)."""
        unknown = sorted(set(options) - set(self.capture_options))
        if unknown:
            takes = ", ".join(self.capture_options) or "none"
            raise TypeError(f"{self.name}: capture takes no option {', '.join(unknown)} (it takes: {takes})")
        return self.capture_graphs(module, dtype, device, **options)


def _is_wan(module: nn.Module) -> bool:
    return _instance_of(module, "diffusers.models.autoencoders.autoencoder_kl_wan", "AutoencoderKLWan")


def _wan_version(module: nn.Module) -> str:
    """Wan 2.2's VAE is the Wan class configured with residual up blocks (`is_residual`)."""
    return "wan2.2" if getattr(module.config, "is_residual", False) else "wan2.1"


def _wan_runner() -> type:
    from rewrite.models.wan.runner import WanRunner

    return WanRunner


def _wan_row(version: str, label: str) -> SupportedModel:
    def make(config: str, seed: int) -> nn.Module:
        from rewrite.models.wan.config import build_wan

        return build_wan(version, config, seed=seed)

    def capture(module: nn.Module, dtype: torch.dtype, device: torch.device) -> list[CapturedGraph]:
        from rewrite.models.wan.capture import capture_wan_decoder

        return list(capture_wan_decoder(module.decoder, dtype, device))

    return SupportedModel(
        name=version, family="wan", type_name="diffusers.AutoencoderKLWan", label=label,
        load_runner=_wan_runner,
        recognise=lambda module: _is_wan(module) and _wan_version(module) == version,
        make=make, capture_graphs=capture, graph_names=("chunk0", "steady"),
        latent_dims=("batch", "channels", "frames", "height", "width"))


def _auk_runner() -> type:
    from rewrite.models.auk.runner import AuKRunner

    return AuKRunner


def _make_auk(config: str, seed: int) -> nn.Module:
    from rewrite.models.auk.model import AuKConfig, AuKVAE

    return AuKVAE(AuKConfig() if config == "full" else AuKConfig.tiny()).eval()


def _capture_auk(module: nn.Module, dtype: torch.dtype, device: torch.device,
                 activations_as_ops: bool = True) -> list[CapturedGraph]:
    from rewrite.models.auk.capture import capture_auk_decode

    return [capture_auk_decode(module, dtype, device, activations_as_ops=activations_as_ops)]


def _qwenimage_runner() -> type:
    from rewrite.models.qwenimage.runner import QwenImageRunner

    return QwenImageRunner


def _make_qwenimage(config: str, seed: int) -> nn.Module:
    from rewrite.models.qwenimage.config import build_qwenimage

    return build_qwenimage(config, seed=seed)


def _capture_qwenimage(module: nn.Module, dtype: torch.dtype, device: torch.device) -> list[CapturedGraph]:
    from rewrite.models.qwenimage.runner import capture_qwenimage

    return capture_qwenimage(module, dtype, device)


MODELS: tuple[SupportedModel, ...] = (
    _wan_row("wan2.1", "Wan 2.1"),
    _wan_row("wan2.2", "Wan 2.2"),
    SupportedModel(
        name="auk", family="auk", type_name="rewrite.models.auk.model.AuKVAE", label=None,
        load_runner=_auk_runner,
        recognise=lambda module: _instance_of(module, "rewrite.models.auk.model", "AuKVAE"),
        make=_make_auk, capture_graphs=_capture_auk, graph_names=("decode",),
        latent_dims=("batch", "frames", "channels"), capture_options=("activations_as_ops",), meta_capture=True),
    SupportedModel(
        name="qwenimage", family="wan", type_name="diffusers.AutoencoderKLQwenImage", label=None,
        load_runner=_qwenimage_runner,
        recognise=lambda module: _instance_of(module, "diffusers.models.autoencoders.autoencoder_kl_qwenimage",
                                              "AutoencoderKLQwenImage"),
        make=_make_qwenimage, capture_graphs=_capture_qwenimage,
        graph_names=("chunk0", "steady"), latent_dims=("batch", "channels", "frames", "height", "width")),
)


# --------------------------------------------------------------------------------------------- lookups


def names() -> tuple[str, ...]:
    """The tools' model names, in table order."""
    return tuple(model.name for model in MODELS)


def get(name: str) -> SupportedModel:
    """The row named ``name`` (ValueError listing the names otherwise)."""
    for model in MODELS:
        if model.name == name:
            return model
    raise ValueError(f"unknown model {name!r}; supported: {', '.join(names())}")


def _labels(labels: list[str]) -> str:
    """``["Wan 2.1", "Wan 2.2"]`` -> ``"Wan 2.1 / 2.2"`` (a shared first word is written once)."""
    heads = {label.split(" ", 1)[0] for label in labels}
    if len(heads) == 1 and all(" " in label for label in labels):
        return f"{heads.pop()} " + " / ".join(label.split(" ", 1)[1] for label in labels)
    return " / ".join(labels)


def supported_names() -> str:
    """The supported classes as error messages name them, e.g. ``diffusers.AutoencoderKLWan (Wan 2.1 / 2.2)``."""
    grouped: dict[str, list[str]] = {}
    for model in MODELS:
        grouped.setdefault(model.type_name, [])
        if model.label:
            grouped[model.type_name].append(model.label)
    return ", ".join(f"{type_name} ({_labels(labels)})" if labels else type_name for type_name, labels in grouped.items())


def model_for(module: nn.Module) -> SupportedModel:
    """The row that recognises ``module`` (TypeError naming the supported models otherwise)."""
    for model in MODELS:
        if model.recognise(module):
            return model
    raise TypeError(f"optimize() supports {supported_names()}; "
                    f"got {type(module).__module__}.{type(module).__qualname__}")


def runner_class_for(module: nn.Module) -> type:
    """The runner class that drives ``module``'s decode (TypeError naming the supported models otherwise)."""
    return model_for(module).runner_class()
