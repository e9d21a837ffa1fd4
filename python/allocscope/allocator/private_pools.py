"""Private memory pools (CUDA graph captures, torch.cuda.MemPool), the part
of DeviceAllocator that follows c10's PrivatePool: a capture routes its
requests to its pool (beginAllocateToPool ... endAllocateToPool), graphs and
pools that share it count as its users, and once the last user is gone
(releasePool) release_cached_blocks frees its unsplit blocks and, when its
last segment is gone, the pool itself.

A mixin of DeviceAllocator (model.py), like expandable.py.
"""

from __future__ import annotations

from .blocks import PoolId, PrivatePool
from .core import AllocatorCore

__all__ = ["PrivatePools"]


class PrivatePools:
    """Making, using and releasing private pools."""

    def private_pool(self: AllocatorCore, pool_id: PoolId) -> PrivatePool:
        """The private pool of that id (made, with one user, if it is new)."""
        owner = self.private.get(pool_id)
        if owner is None:
            owner = self.private[pool_id] = PrivatePool(pool_id)
        return owner

    def begin_pool(self: AllocatorCore, pool_id: PoolId, capture: bool = True) -> None:
        """A capture (or a MemPool, capture=False) starts using a pool."""
        owner = self.private.get(pool_id)
        if owner is None:
            self.private_pool(pool_id)
        else:
            owner.use_count += 1
        if capture:
            self.captures.append(pool_id)

    def end_pool(self: AllocatorCore, pool_id: PoolId) -> None:
        if pool_id in self.captures:
            self.captures.remove(pool_id)

    def release_pool(self: AllocatorCore, pool_id: PoolId) -> None:
        """A graph (or MemPool) that used the pool is gone; with its last user
        gone, release_cached_blocks frees the pool's unsplit blocks."""
        owner = self.private.get(pool_id)
        if owner is None:
            return
        owner.use_count -= 1
        if owner.use_count <= 0:
            self.freeable[pool_id] = owner

    def _release_freeable_pools(self: AllocatorCore) -> None:
        """release_cached_blocks' last step: the unsplit blocks of every pool
        no capture uses, in the order of c10's hash map of them."""
        if self.recorded_frees is not None and len(self.freeable) > 1:
            self._follow_recorded_pool_order()
        for pool_id, owner in self.freeable.visit():
            self._release_blocks(owner.small)
            self._release_blocks(owner.large)
            if owner.segments <= 0:
                del self.private[pool_id]
                self.freeable.erase_current()

    def _follow_recorded_pool_order(self: AllocatorCore) -> None:
        """c10's map of freeable pools grows and never shrinks: its size, and
        so its order, depends on how many pools were ever freeable at once,
        before the recording too. When several pools are about to release
        segments in an order the map here does not give, the recording says
        which larger map it was: the smallest one whose order gives the
        recorded order of segment frees is kept from here on."""
        segments = {pool_id: {b.addr for p in (owner.small, owner.large) for b in self._free_in_order(p)
                              if not b.is_split and not b.seg.expandable}
                    for pool_id, owner in ((k, self.freeable[k]) for k in self.freeable)}
        releasing = [pool_id for pool_id in self.freeable if segments[pool_id]]  # in the map's order
        if len(releasing) < 2:
            return
        owner_of = {a: pool_id for pool_id, addrs in segments.items() for a in addrs}
        recorded: list = []
        for addr in self.recorded_frees(sum(len(a) for a in segments.values())):
            pool_id = owner_of.get(addr)
            if pool_id is None:
                break
            if pool_id not in recorded:
                recorded.append(pool_id)
        if len(recorded) < len(releasing) or releasing == recorded:
            return
        buckets = max(self.freeable.buckets, 4)
        while buckets <= 1 << 16:
            bigger = self.freeable.rehashed(buckets)
            if [p for p in bigger if segments.get(p)] == recorded:
                self.freeable = bigger
                return
            buckets *= 2
