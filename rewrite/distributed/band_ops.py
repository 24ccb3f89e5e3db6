"""The collective custom ops of the band step graphs (`rewrite.distributed.band_graphs`).

Three ops in the ``rewrite`` torch.library namespace, each taking the integer id of a `BandContext` (the
band geometry a pair of graphs was exported for; the decode call that runs them sets its `BandRun`):

* `rewrite::band_halo_rows(x, context)`: x (this rank's band, rows in dim -2) with one row more on each
  side: the neighbour's adjacent row (`Comm.exchange_halo`), zeros at the global top and bottom edges
  (there the extra row is the zero pad of the conv that reads it);
* `rewrite::band_gather_rows(x, context)`: the whole tensor whose band x is (every rank's rows, all-gathered);
* `rewrite::band_own_rows(x, context)`: this rank's rows of a whole tensor.

Every output is dense, its dims laid out in x's order (`bands.empty_like_layout`): the fakes say so, the
real ops write so. Exactness: data movement only (values copied bit for bit). The ops are opaque to export
and to the pattern passes (no pattern names them), so a fusion never reaches across a collective.
"""

from __future__ import annotations

import itertools
import threading
import weakref

import torch
from torch import Tensor

from rewrite.distributed.bands import empty_like_layout

_IDS = itertools.count(1)
_CONTEXTS: "weakref.WeakValueDictionary[int, BandContext]" = weakref.WeakValueDictionary()  # held by their graphs
_LOCK = threading.Lock()


class BandContext:
    """The latent row bands (`rows`, [start, stop) per rank) and this `rank` that a graph pair was exported
    for; `run` is the `BandRun` of the call that runs the graphs now (None between calls)."""

    def __init__(self, rows: list[tuple[int, int]], rank: int) -> None:
        self.rows, self.rank, self.run = [tuple(r) for r in rows], rank, None
        with _LOCK:
            self.id = next(_IDS)
            _CONTEXTS[self.id] = self

    def scale(self, band_rows: int) -> int:
        """The resolution factor of a band tensor of `band_rows` rows against the latent band."""
        a, b = self.rows[self.rank]
        s, rest = divmod(band_rows, b - a)
        if rest or s < 1:
            raise RuntimeError(f"band graphs: {band_rows} rows is no multiple of the latent band {b - a}")
        return s

    def active(self):
        if self.run is None:
            raise RuntimeError("band graphs: a collective op ran outside a sharded decode call")
        return self.run


def context(context_id: int) -> BandContext:
    found = _CONTEXTS.get(context_id)
    if found is None:
        raise RuntimeError(f"band graphs: no band context {context_id} in this process")
    return found


def _with_rows(x: Tensor, rows: int) -> list[int]:
    shape = list(x.shape)
    shape[-2] = rows
    return shape


@torch.library.custom_op("rewrite::band_halo_rows", mutates_args=())
def band_halo_rows(x: Tensor, context_id: int) -> Tensor:
    """x with the neighbours' adjacent rows above and below it (zeros at the global edges)."""
    run = context(context_id).active()
    top, bottom = run.comm.exchange_halo(x, 1, "the halo exchange of a band graph")
    out = empty_like_layout(_with_rows(x, x.shape[-2] + 2), x)
    out[..., 1:-1, :] = x
    for row, value in ((0, top), (-1, bottom)):
        if value is None:
            out[..., row, :] = 0
        else:
            out[..., row, :] = value[..., 0, :]
    return out


@band_halo_rows.register_fake
def _(x, context_id):
    return empty_like_layout(_with_rows(x, x.shape[-2] + 2), x)


def _whole_rows(x: Tensor, context_id: int) -> int:
    ctx = context(context_id)
    return ctx.scale(x.shape[-2]) * ctx.rows[-1][1]


@torch.library.custom_op("rewrite::band_gather_rows", mutates_args=())
def band_gather_rows(x: Tensor, context_id: int) -> Tensor:
    """The whole tensor of which x is this rank's band, on every rank."""
    return context(context_id).active().gather(x, "the gather of a band graph")


@band_gather_rows.register_fake
def _(x, context_id):
    return empty_like_layout(_with_rows(x, _whole_rows(x, context_id)), x)


def _own_rows(x: Tensor, context_id: int) -> int:
    ctx = context(context_id)
    s, rest = divmod(x.shape[-2], ctx.rows[-1][1])
    if rest:
        raise RuntimeError(f"band graphs: {x.shape[-2]} rows is no multiple of the latent height {ctx.rows[-1][1]}")
    a, b = ctx.rows[ctx.rank]
    return s * (b - a)


@torch.library.custom_op("rewrite::band_own_rows", mutates_args=())
def band_own_rows(x: Tensor, context_id: int) -> Tensor:
    """This rank's rows of the whole tensor x (dense, in x's layout)."""
    return context(context_id).active().own(x)


@band_own_rows.register_fake
def _(x, context_id):
    return empty_like_layout(_with_rows(x, _own_rows(x, context_id)), x)
