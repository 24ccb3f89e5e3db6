"""The custom ops of the band step graphs (`rewrite.models.wan.distributed.band_graphs`) that cross ranks.

In the ``rewrite`` torch.library namespace; those that talk to other ranks take the integer id of a
`BandContext` (the band geometry a pair of graphs was exported for; the decode call that runs them sets
its `BandRun`). A halo row band, x with one more row on each side (the neighbour's adjacent row, zeros at
the global top and bottom edges, where the extra row is the zero pad of the conv that reads it), is made
by three ops, so that only rows travel between ranks and a CUDA-graph segment ends before the exchange:

* `rewrite::band_halo_pack(x) -> (first, last)`: x's first and last rows (local);
* `rewrite::band_halo_exchange(first, last, context) -> (above, below)`: the previous rank's `last` and the
  next rank's `first` (`Comm.exchange_edges`), zeros at the global edges (the collective);
* `rewrite::band_halo_unpack(x, above, below) -> x with the two rows` (local).

And for the middle block's attention: `rewrite::band_gather_rows(x, context)` (the whole tensor, all-gathered:
a collective) and `rewrite::band_own_rows(x, context)` (this rank's rows of a whole tensor: local).

`COLLECTIVES` are the ops that talk to other ranks. Every output is dense, its dims laid out in its first
input's order (`bands.empty_like_layout`): the fakes say so, the real ops write so. Exactness: data movement
only (values copied bit for bit). No pattern names these ops, so a fusion never reaches across one.
"""

from __future__ import annotations

import itertools
import threading
import weakref

import torch
from torch import Tensor

from rewrite.models.wan.distributed.bands import empty_like_layout

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


def _edge(x: Tensor, row: int) -> Tensor:
    return empty_like_layout(_with_rows(x, 1), x).copy_(x[..., row:row + 1 if row >= 0 else None, :])


@torch.library.custom_op("rewrite::band_halo_pack", mutates_args=())
def band_halo_pack(x: Tensor) -> tuple[Tensor, Tensor]:
    """x's first and last rows (dense, in x's layout): what goes to the neighbours."""
    return _edge(x, 0), _edge(x, -1)


@band_halo_pack.register_fake
def _(x):
    return empty_like_layout(_with_rows(x, 1), x), empty_like_layout(_with_rows(x, 1), x)


@torch.library.custom_op("rewrite::band_halo_exchange", mutates_args=())
def band_halo_exchange(first: Tensor, last: Tensor, context_id: int) -> tuple[Tensor, Tensor]:
    """(the previous rank's `last`, the next rank's `first`), zeros at the global edges."""
    above, below = context(context_id).active().comm.exchange_edges(first, last, "the halo exchange of a band graph")
    return (torch.zeros_like(last) if above is None else empty_like_layout(last.shape, last).copy_(above),
            torch.zeros_like(first) if below is None else empty_like_layout(first.shape, first).copy_(below))


@band_halo_exchange.register_fake
def _(first, last, context_id):
    return empty_like_layout(last.shape, last), empty_like_layout(first.shape, first)


@torch.library.custom_op("rewrite::band_halo_unpack", mutates_args=())
def band_halo_unpack(x: Tensor, above: Tensor, below: Tensor) -> Tensor:
    """x with `above` as a row before its first and `below` after its last."""
    out = empty_like_layout(_with_rows(x, x.shape[-2] + 2), x)
    out[..., 1:-1, :] = x
    out[..., :1, :] = above
    out[..., -1:, :] = below
    return out


@band_halo_unpack.register_fake
def _(x, above, below):
    return empty_like_layout(_with_rows(x, x.shape[-2] + 2), x)


def halo_rows(x: Tensor, context_id: int) -> Tensor:
    """The halo row band of x: pack, exchange, unpack (module docstring)."""
    ops = torch.ops.rewrite
    first, last = ops.band_halo_pack(x)
    above, below = ops.band_halo_exchange(first, last, context_id)
    return ops.band_halo_unpack(x, above, below)


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


#: the ops that talk to other ranks (a CUDA-graph segment of a band graph ends before each)
COLLECTIVES = (torch.ops.rewrite.band_halo_exchange.default, torch.ops.rewrite.band_gather_rows.default)
