"""Test helper: run callers in threads that start together."""

from __future__ import annotations

import threading

import torch


def run_threads(count: int, target) -> list:
    """`target(i)` in `count` threads started together, under ``torch.no_grad()`` (grad mode is per thread);
    their results in order, re-raising the first error in the calling thread."""
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list = []

    def run(i):
        try:
            barrier.wait()
            with torch.no_grad():
                results[i] = target(i)
        except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
