"""The models the library supports: one table for `optimize`, `rewrite-debug`, `rewrite-bench` and `rewrite-demo`.

`MODELS` holds one line per model family, its rows (`rewrite/models/<family>/rows.py`). Each row
(`rewrite.models.supported_model.SupportedModel`) says how to recognise an instance cheaply (a class is looked
up only in a module that is already imported), which runner drives it (a function that imports the runner's
module on first use, so that the table imports no runtime), how a tool builds a seeded random-init model and
captures its graphs, and what the graphs and their symbolic sizes are called.

`runner_class_for(module)` is what `optimize` needs; `get(name)` is what the tools need. `Runner` is the
protocol the runner classes satisfy: what the API calls on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn

from rewrite.models.auk import rows as auk_rows
from rewrite.models.qwenimage import rows as qwenimage_rows
from rewrite.models.supported_model import CONFIGS, SupportedModel, loaded_class  # noqa: F401  (the tools read them here)
from rewrite.models.wan import rows as wan_rows

if TYPE_CHECKING:
    from rewrite.reporting import FallbackLog, GraphReport, TimingLog, WarmupResult

#: the dtypes the tools accept, by the name they are given on the command line
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

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


# --------------------------------------------------------------------------------------------- the table

#: one line per model family: its rows (`rewrite/models/<family>/rows.py`)
MODELS: tuple[SupportedModel, ...] = (
    *wan_rows.ROWS,
    *auk_rows.ROWS,
    *qwenimage_rows.ROWS,
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
