"""One row of the models table (`rewrite.supported`): how to recognise an instance of a model cheaply, which
runner drives it, how the tools build a seeded random-init one and capture its graphs. Each model family
declares its rows in `rewrite/models/<family>/rows.py`; nothing here names a family.

A class is looked up only in a module that is already imported (`instance_of`): no instance of a class can
exist before its module is loaded, and importing diffusers for another model would cost seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from rewrite.capture.export import CapturedGraph

#: model sizes every row builds: the published geometry and a small one for CPU tests
CONFIGS: tuple[str, ...] = ("full", "tiny")


def loaded_class(module_name: str, class_name: str) -> type | None:
    """``module_name.class_name`` if that module is already imported, else None (nothing is imported)."""
    module = sys.modules.get(module_name)
    return getattr(module, class_name, None) if module is not None else None


def instance_of(module: nn.Module, module_name: str, class_name: str) -> bool:
    """Whether `module` is an instance of ``module_name.class_name`` (False while that module is not imported)."""
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


@dataclasses.dataclass(frozen=True)
class EncoderCapture:
    """How the tools capture a model's encoder as step graphs (`rewrite-debug --encoder` shows them; the runner
    serves `encode` from the same capture, `rewrite.models.wan.encode`)."""

    capture_graphs: Callable[[nn.Module, torch.dtype, torch.device], list[CapturedGraph]]  # (module, dtype, device)
    graph_names: tuple[str, ...]  # the names of the captured graphs, in capture order
    input_dims: tuple[str, ...]  # names of the dims of the graphs' first input (the video's)


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
    encoder: EncoderCapture | None = None  # its encoder's step graphs, where the tools can capture them

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
