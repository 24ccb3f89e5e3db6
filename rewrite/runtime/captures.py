"""Captured graphs per (dtype, device), captured and rewritten on first use; a failed capture is remembered.

Shared by the model runners. A capture runs alone among rewrite's work (`locks.CAPTURE_GATE`: torch.export
switches backends off process-wide while it traces). A capture that raises is never retried for its key:
the runner reports the stored reason and takes the reference path from then on (a failed capture must never
become a wrong answer). Running out of device memory (a capture's self-checks run real tensors) is no failed
capture: it propagates, and the decode frees memory and tries again. `forget(key)` drops a key's graphs or error, for a module that changed since.
"""

from __future__ import annotations

from typing import Callable, Generic, Hashable, TypeVar

import torch

from rewrite.runtime.locks import CAPTURE_GATE

T = TypeVar("T")


class CaptureCache(Generic[T]):
    def __init__(self) -> None:
        self.values: dict[Hashable, T] = {}
        self.errors: dict[Hashable, str] = {}

    def get(self, key: Hashable, capture: Callable[[], T], what: str) -> T | None:
        """The value for `key`, from `capture()` on first use; None when that capture failed (`errors[key]`)."""
        if key not in self.values and key not in self.errors:
            with CAPTURE_GATE.capturing():
                try:
                    self.values[key] = capture()
                except torch.OutOfMemoryError:
                    raise  # no failed capture: the decode frees memory and tries again (`DecoderRunner.within_memory`)
                except Exception as error:  # recorded, reported, and the reference path runs instead
                    self.errors[key] = f"capture failed for {what}: {type(error).__name__}: {error}"
        return self.values.get(key)

    def forget(self, key: Hashable) -> None:
        self.values.pop(key, None)
        self.errors.pop(key, None)

    def __getitem__(self, key: Hashable) -> T:
        return self.values[key]
