"""torch.distributed on the virtual GPU (docs/vgpu.md, "Many GPUs").

Two things happen here, once torch is imported, in a process on the virtual
GPU:

- Object collectives on an NCCL group, whose bytes the virtual NCCL would
  not carry (the source's tensor is made by a kernel, which computes
  nothing), pass their objects through the run's store where all the
  ranks run, so they return what they return on a card. A rank alone has
  no peers: `all_gather_object` and `gather_object` give its own object in
  every slot, `broadcast_object_list` leaves its list as it passed it,
  `scatter_object_list` gives the entry of its own input list for its rank
  (None without one). `recv_object_list` leaves the list as it was
  everywhere (send_object_list is not carried).

- One rank of a large job (ENV_WORLD, set by `allocscope run/fit
  --world-size`): the process is rank RANK of WORLD_SIZE as under torchrun,
  alone. The env://, tcp:// and file:// rendezvous give it a store in which
  every other rank has already done what this rank does (LoneStore), so that
  init_process_group("nccl"), new_group and DeviceMesh never wait for a
  peer; the virtual NCCL needs none.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Iterator

__all__ = ["ENV_WORLD", "install"]

# "1" in a process that is one rank of a job whose other ranks do not run.
ENV_WORLD = "ALLOCSCOPE_SIMULATED_WORLD"
# ncclUniqueId's size: what a store read of an id another rank would have
# published returns (the virtual NCCL ignores its content).
_NCCL_UNIQUE_ID_BYTES = 128


def install() -> None:
    """After torch is imported (common/torch_hook.py)."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    _patch_object_collectives()
    if os.environ.get(ENV_WORLD) == "1":
        _install_lone_rendezvous()
        _report_at_exit(os.environ.get("ALLOCSCOPE_WORLD_REPORT"))


# ---- object collectives

def _on_virtual_nccl(group: Any) -> bool:
    import torch.distributed as dist

    try:
        return dist.get_backend(group) == "nccl"
    except Exception:  # not initialized, or not a member: torch's own error
        return False


def _my_rank(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_rank(group) if group is not None else dist.get_rank()


class _Objects:
    """Where the processes of a run are all there (torchrun on virtual
    cards), object collectives exchange their pickled objects through the
    run's own store (the one torch rendezvoused with), which every rank
    reaches: each collective of a group has a number, the same in every rank
    (ranks make a group's collectives in the same order, as torch requires).
    A rank alone (ENV_WORLD) has no peers to hear from: None."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    @staticmethod
    def available() -> "_Objects | None":
        return None if os.environ.get(ENV_WORLD) == "1" else _objects

    def key(self, group: Any) -> str:
        import torch.distributed as dist

        name = getattr(group if group is not None else dist.group.WORLD, "group_name", "default")
        n = self.counts[name] = self.counts.get(name, -1) + 1
        return f"allocscope/objects/{name}/{n}"

    @staticmethod
    def store() -> Any:
        import torch.distributed.distributed_c10d as c10d

        return c10d._get_default_store()


_objects = _Objects()


def _global_rank(group: Any, group_rank: int) -> int:
    import torch.distributed as dist

    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _group_size(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


def _patch_object_collectives() -> None:
    import pickle

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if getattr(c10d, "_allocscope_patched", False):
        return
    original = {name: getattr(c10d, name) for name in
                ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
                 "recv_object_list")}

    def source(group: Any, rank: int | None, group_rank: int | None) -> int:
        """The group rank of a collective's source or destination."""
        if group_rank is not None:
            return group_rank
        return dist.get_group_rank(group, rank) if group is not None and rank is not None else (rank or 0)

    def all_gather_object(object_list: list, obj: Any, group: Any = None) -> None:
        if not _on_virtual_nccl(group):
            return original["all_gather_object"](object_list, obj, group)
        # torch's own first (its allocations; the virtual NCCL puts this
        # rank's object in every slot), then the others' where they run.
        original["all_gather_object"](object_list, obj, group)
        ex = _Objects.available()
        if ex is not None:
            key, store = ex.key(group), ex.store()
            store.set(f"{key}/{_my_rank(group)}", pickle.dumps(obj))
            for i in range(min(len(object_list), _group_size(group))):
                object_list[i] = pickle.loads(store.get(f"{key}/{i}"))

    def gather_object(obj: Any, object_gather_list: list | None = None, dst: int | None = None, group: Any = None,
                      group_dst: int | None = None) -> None:
        if not _on_virtual_nccl(group):
            return original["gather_object"](obj, object_gather_list, dst, group, group_dst)
        me, ex = _my_rank(group), _Objects.available()
        if ex is not None:
            key, store = ex.key(group), ex.store()
            store.set(f"{key}/{me}", pickle.dumps(obj))
            if me == source(group, dst, group_dst) and object_gather_list is not None:
                for i in range(min(len(object_gather_list), _group_size(group))):
                    object_gather_list[i] = pickle.loads(store.get(f"{key}/{i}"))
        elif object_gather_list is not None:
            for i in range(len(object_gather_list)):
                object_gather_list[i] = obj

    def broadcast_object_list(object_list: list, src: int | None = None, group: Any = None, device: Any = None,
                              group_src: int | None = None) -> None:
        if not _on_virtual_nccl(group):
            return original["broadcast_object_list"](object_list, src, group, device, group_src)
        root, me, ex = source(group, src, group_src), _my_rank(group), _Objects.available()
        # As its own source: the source's allocations and collectives, and
        # the list comes back as it went.
        if group is None:
            original["broadcast_object_list"](object_list, dist.get_rank(), None, device)
        else:
            original["broadcast_object_list"](object_list, None, group, device, me)
        if ex is not None:
            key, store = ex.key(group), ex.store()
            if me == root:
                store.set(key, pickle.dumps(list(object_list)))
            else:
                object_list[:] = pickle.loads(store.get(key))[:len(object_list)]

    def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: list | None = None,
                            src: int | None = None, group: Any = None, group_src: int | None = None) -> None:
        if not _on_virtual_nccl(group):
            return original["scatter_object_list"](scatter_object_output_list, scatter_object_input_list, src,
                                                   group, group_src)
        me, inputs, ex = _my_rank(group), scatter_object_input_list, _Objects.available()
        if ex is not None:
            key, store = ex.key(group), ex.store()
            if me == source(group, src, group_src):
                for i, item in enumerate(inputs or ()):
                    store.set(f"{key}/{i}", pickle.dumps(item))
            scatter_object_output_list[0] = pickle.loads(store.get(f"{key}/{me}"))
        else:
            scatter_object_output_list[0] = inputs[me] if inputs is not None and me < len(inputs) else None

    def recv_object_list(object_list: list, src: int | None = None, group: Any = None, device: Any = None,
                         group_src: int | None = None) -> int:
        if not _on_virtual_nccl(group):
            return original["recv_object_list"](object_list, src, group, device, group_src)
        return src if src is not None else _global_rank(group, group_src or 0)

    for f in (all_gather_object, gather_object, broadcast_object_list, scatter_object_list, recv_object_list):
        f.__doc__ = original[f.__name__].__doc__
        f.__wrapped__ = original[f.__name__]  # type: ignore[attr-defined]
        setattr(c10d, f.__name__, f)
        if getattr(dist, f.__name__, None) is original[f.__name__]:
            setattr(dist, f.__name__, f)
    c10d._allocscope_patched = True  # type: ignore[attr-defined]


# ---- one rank alone

def _lone_store_class() -> type:
    import torch.distributed as dist

    class LoneStore(dist.Store):
        """A store for one rank of a job whose other ranks do not run: every
        other rank is taken to have made the same calls already. A counter
        grows by a call's amount times the world size; a key another rank
        would have published reads as an NCCL unique id (all zeros), the
        only value torch reads from its peers when creating communicators."""

        def __init__(self, world_size: int) -> None:
            super().__init__()
            self._world = world_size
            self._data: dict[str, bytes] = {}
            self._timeout = timedelta(minutes=30)

        def set(self, key: str, value: Any) -> None:
            self._data[key] = value if isinstance(value, bytes) else str(value).encode()

        def get(self, key: str) -> bytes:
            return self._data.get(key, b"\0" * _NCCL_UNIQUE_ID_BYTES)

        def add(self, key: str, amount: int) -> int:
            value = int(self._data.get(key, b"0")) + amount * self._world
            self._data[key] = str(value).encode()
            return value

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            expected = expected if isinstance(expected, bytes) else str(expected).encode()
            desired = desired if isinstance(desired, bytes) else str(desired).encode()
            current = self._data.get(key)
            if current is None and expected == b"" or current == expected:
                self._data[key] = desired
                return desired
            return current if current is not None else expected

        def append(self, key: str, value: Any) -> None:
            self._data[key] = self._data.get(key, b"") + (value if isinstance(value, bytes) else str(value).encode())

        def multi_get(self, keys: list[str]) -> list[bytes]:
            return [self.get(k) for k in keys]

        def multi_set(self, keys: list[str], values: list[Any]) -> None:
            for k, v in zip(keys, values):
                self.set(k, v)

        def delete_key(self, key: str) -> bool:
            return self._data.pop(key, None) is not None

        def num_keys(self) -> int:
            return len(self._data)

        def check(self, keys: list[str]) -> bool:
            # Only what this rank set: torch's watchdog checks for keys other
            # ranks set when they time out, which here never happens.
            return all(k in self._data for k in keys)

        def wait(self, keys: list[str], timeout: Any = None) -> None:
            return None

        def set_timeout(self, timeout: timedelta) -> None:
            self._timeout = timeout

        @property
        def timeout(self) -> timedelta:
            return self._timeout

        def has_extended_api(self) -> bool:
            return True

    return LoneStore


_stores: list[Any] = []


def _report_at_exit(path: str | None) -> None:
    """Tells `allocscope run/fit --world-size` whether the script initialized
    a process group (through a rendezvous, or with its own store)."""
    if not path:
        return
    import atexit
    import json

    def write() -> None:
        import torch.distributed as dist

        try:
            with open(path, "w") as f:
                json.dump({"initialized": bool(_stores) or dist.is_initialized()}, f)
        except OSError:
            pass

    atexit.register(write)


def _install_lone_rendezvous() -> None:
    import importlib

    # torch.distributed.rendezvous is also the name of a function there.
    rdzv = importlib.import_module("torch.distributed.rendezvous")
    store_class = _lone_store_class()

    def handler(url: str, timeout: timedelta | None = None, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
        from urllib.parse import parse_qs, urlparse

        query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
        rank, world = int(query.get("rank", -1)), int(query.get("world_size", -1))
        rank = rank if rank >= 0 else int(os.environ.get("RANK", "0"))
        world = world if world > 0 else int(os.environ.get("WORLD_SIZE", "1"))
        store = store_class(world)
        # torch keeps only the C++ side of a Python store: without a Python
        # reference its methods would be gone when torch calls them.
        _stores.append(store)
        yield store, rank, world

    for scheme in ("env", "tcp", "file"):
        rdzv._rendezvous_handlers[scheme] = handler
