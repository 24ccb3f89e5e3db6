"""The collectives of a sharded decode over one `torch.distributed` process group.

`Comm` wraps the group: one-row halo exchange with the neighbouring bands (`batch_isend_irecv`), all-gather
and gather of row bands of different heights, a verdict all-reduce, and the failure protocol:

* every collective waits on its work, bounded by `timeout` where given, else by the process group's own
  timeout (gloo); a peer process that exits closes its connections, which fails the wait at once;
* a rank whose own code raises posts the error to the group's store (`<prefix>/error/<rank>`) before the
  exception leaves `decode_sharded`; a rank whose collective then fails reads those posts and raises
  `PeerFailedError` naming the rank and its error, else `CollectiveError` with the transport's message.

After either error the group has unfinished operations and should be destroyed (`destroy_process_group`).
With the gloo backend, CUDA tensors are staged through host memory (gloo's send/recv take CPU tensors).
"""

from __future__ import annotations

import datetime
import itertools
import logging

import torch
import torch.distributed as dist

logger = logging.getLogger("rewrite.models.wan.distributed")


class DistributedDecodeError(RuntimeError):
    """A sharded decode failed on this rank because of the group (a collective failed or timed out)."""


class CollectiveError(DistributedDecodeError):
    """A collective failed or timed out and no peer posted an error of its own."""


class PeerFailedError(DistributedDecodeError):
    """Another rank's code raised during the sharded decode; the message names the rank and its error."""


_CALLS: dict[tuple, itertools.count] = {}


def resolve_group(group):
    """A ProcessGroup from `group` (None: the default group; a 1-D DeviceMesh: its group)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("decode_sharded needs an initialized torch.distributed process group "
                           "(torch.distributed.init_process_group)")
    if group is None:
        return dist.group.WORLD
    if hasattr(group, "get_group") and hasattr(group, "ndim"):  # a DeviceMesh
        if group.ndim != 1:
            raise ValueError(f"decode_sharded takes a 1-D DeviceMesh; got {group.ndim} dimensions")
        return group.get_group()
    return group


class Comm:
    """Collectives of one decode call on `group`. `rank`/`world` are group ranks."""

    def __init__(self, group, timeout=None) -> None:
        self.group = group
        if timeout is not None and not isinstance(timeout, datetime.timedelta):
            timeout = datetime.timedelta(seconds=float(timeout))
        self.timeout = timeout  # per wait; None: the process group's own timeout
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group)).lower()
        self.name = getattr(group, "group_name", "") or "default"
        ranks = tuple(dist.get_process_group_ranks(group))
        self._global = ranks
        counter = _CALLS.setdefault((self.name, ranks), itertools.count())
        self.call = next(counter)  # every rank counts the same calls: keys of one call are its own
        self.prefix = f"rewrite.models.wan.distributed/{self.name}/{self.call}"
        try:
            self.store = dist.distributed_c10d._get_default_store()
        except Exception:  # noqa: BLE001 - no store: errors are still raised, without the peer's message
            self.store = None

    # ---- failure protocol -----------------------------------------------------------------------------
    def post_error(self, error: BaseException) -> None:
        """Tell the peers why this rank stops (called before the exception leaves decode_sharded)."""
        if self.store is None:
            return
        try:
            self.store.set(f"{self.prefix}/error/{self.rank}", f"{type(error).__name__}: {error}"[:4000])
        except Exception as failure:  # noqa: BLE001 - the store itself may be gone (its host rank died)
            logger.debug("could not post the error to the store: %s", failure)

    def peer_errors(self) -> dict[int, str]:
        if self.store is None:
            return {}
        found = {}
        for rank in range(self.world):
            if rank == self.rank:
                continue
            key = f"{self.prefix}/error/{rank}"
            try:
                if self.store.check([key]):
                    found[rank] = self.store.get(key).decode(errors="replace")
            except Exception:  # noqa: BLE001
                break
        return found

    def _failed(self, what: str, error: Exception) -> DistributedDecodeError:
        peers = self.peer_errors()
        if peers:
            text = "; ".join(f"rank {r} failed: {msg}" for r, msg in sorted(peers.items()))
            return PeerFailedError(f"sharded decode stopped on rank {self.rank} during {what}: {text}")
        return CollectiveError(f"sharded decode: {what} failed on rank {self.rank} of {self.world} "
                               f"({self.backend}): {error}")

    def _wait(self, works, what: str) -> None:
        # inside a CUDA graph capture (a band step captured whole, NCCL) a wait may only order the streams: a
        # timeout makes the host poll the work's completion, which a capture forbids
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        for work in works if isinstance(works, (list, tuple)) else [works]:
            try:
                work.wait() if self.timeout is None or capturing else work.wait(self.timeout)
            except Exception as error:
                raise self._failed(what, error) from error

    # ---- transport ------------------------------------------------------------------------------------
    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        if self.backend == "gloo" and t.device.type != "cpu":
            return t.cpu()
        return t

    def _empty(self, shape, like: torch.Tensor) -> torch.Tensor:
        device = "cpu" if self.backend == "gloo" else like.device
        return torch.empty(shape, dtype=like.dtype, device=device)

    def all_reduce_min(self, value: int, what: str) -> int:
        t = torch.tensor([int(value)], dtype=torch.int64)
        if self.backend == "nccl":
            t = t.cuda()
        self._wait(dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group, async_op=True), what)
        return int(t.item())

    def all_gather_vector(self, vector: torch.Tensor, what: str) -> list[torch.Tensor]:
        """All ranks' int64 vectors of one length."""
        t = vector.to(torch.int64)
        if self.backend == "nccl":
            t = t.cuda()
        out = [torch.empty_like(t) for _ in range(self.world)]
        self._wait(dist.all_gather(out, t, group=self.group, async_op=True), what)
        return [o.cpu() for o in out]

    def exchange_halo(self, x: torch.Tensor, rows: int, what: str):
        """(top, bottom): the `rows` rows above this band (the previous rank's last rows) and below it (the
        next rank's first rows), None at the global edges. `x`: this band, rows in dim -2."""
        return self.exchange_edges(x[..., :rows, :], x[..., -rows:, :], what)

    def exchange_edges(self, first: torch.Tensor, last: torch.Tensor, what: str):
        """(above, below): the previous rank's `last` and the next rank's `first` (this rank's first rows go
        up, its last rows down; same shapes on every rank), None at the global edges."""
        ops, top, bottom = [], None, None
        if self.rank > 0:
            peer = self._global[self.rank - 1]
            top = self._empty(list(last.shape), last)
            ops += [dist.P2POp(dist.isend, self._wire(first), peer, self.group),
                    dist.P2POp(dist.irecv, top, peer, self.group)]
        if self.rank < self.world - 1:
            peer = self._global[self.rank + 1]
            bottom = self._empty(list(first.shape), first)
            ops += [dist.P2POp(dist.isend, self._wire(last), peer, self.group),
                    dist.P2POp(dist.irecv, bottom, peer, self.group)]
        if ops:
            self._wait(dist.batch_isend_irecv(ops), what)
        return (None if top is None else top.to(first.device), None if bottom is None else bottom.to(first.device))

    def gather_rows(self, x: torch.Tensor, heights: list[int], what: str, to: int | None = None):
        """Concatenate every rank's band of `x` along dim -2 (`heights[r]` rows on rank r). On every rank
        (`to` None) or on group rank `to` (None returned elsewhere). Bands are padded to the tallest for
        the transport and cut back."""
        tallest = max(heights)
        shape = list(x.shape)
        shape[-2] = tallest
        mine = self._wire(x)
        if mine.shape[-2] < tallest:
            pad = torch.zeros(shape[:-2] + [tallest - mine.shape[-2], shape[-1]], dtype=x.dtype, device=mine.device)
            mine = torch.cat([mine, pad], -2)
        if to is None:
            out = [self._empty(shape, x) for _ in range(self.world)]
            self._wait(dist.all_gather(out, mine, group=self.group, async_op=True), what)
        else:
            out = [self._empty(shape, x) for _ in range(self.world)] if self.rank == to else None
            self._wait(dist.gather(mine, out, dst=self._global[to], group=self.group, async_op=True), what)
            if out is None:
                return None
        whole = torch.cat([piece[..., :h, :] for piece, h in zip(out, heights)], -2)
        return whole.to(x.device)

    def gather_objects_of_tensors(self, tensors: list[torch.Tensor], like: torch.Tensor, what: str):
        """Every rank's list of tensors (any shapes, one dtype), on every rank: [rank][i]."""
        shapes = torch.zeros(1 + 6 * len(tensors), dtype=torch.int64)
        shapes[0] = len(tensors)
        for i, t in enumerate(tensors):
            shapes[1 + 6 * i] = t.dim()
            shapes[2 + 6 * i: 2 + 6 * i + t.dim()] = torch.tensor(t.shape)
        lengths = self.all_gather_vector(torch.tensor([shapes.numel()]), what)
        longest = int(max(l.item() for l in lengths))
        padded = torch.cat([shapes, torch.zeros(longest - shapes.numel(), dtype=torch.int64)])
        all_shapes = self.all_gather_vector(padded, what)
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else like.new_empty(0)
        sizes = [sum(_numel(s, i) for i in range(int(s[0]))) for s in all_shapes]
        wire = self._wire(flat)
        if wire.numel() < max(sizes):
            wire = torch.cat([wire, wire.new_zeros(max(sizes) - wire.numel())])
        out = [self._empty([max(sizes)], like) for _ in range(self.world)]
        self._wait(dist.all_gather(out, wire, group=self.group, async_op=True), what)
        result = []
        for s, buf in zip(all_shapes, out):
            pieces, offset = [], 0
            for i in range(int(s[0])):
                shape = [int(v) for v in s[2 + 6 * i: 2 + 6 * i + int(s[1 + 6 * i])]]
                n = _numel(s, i)
                pieces.append(buf[offset: offset + n].view(shape).to(like.device))
                offset += n
            result.append(pieces)
        return result


def _numel(shapes: torch.Tensor, i: int) -> int:
    n = 1
    for v in shapes[2 + 6 * i: 2 + 6 * i + int(shapes[1 + 6 * i])]:
        n *= int(v)
    return n
