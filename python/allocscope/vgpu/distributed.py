"""torch.distributed on the virtual GPU (docs/vgpu.md, "Many GPUs").

Two things happen here, once torch is imported, in a process on the virtual
GPU:

- Object collectives and object point-to-point calls on an NCCL group, whose
  bytes the virtual NCCL would not carry (the source's tensor is made by a
  kernel, which computes nothing), pass their objects through the run's
  store between the ranks that run, so they return what they return on a
  card (objects.py). A rank that does not run (below) is taken to have sent
  what this rank sent: `all_gather_object` and `gather_object` give this
  rank's object in its slots, `broadcast_object_list` from it leaves the
  list as it was passed, `scatter_object_list` from it gives the entry of
  this rank's own input list for its rank (None without one),
  `recv_object_list` from it leaves the list as it was.

- Ranks of a large job (ENV_WORLD, set by `allocscope run/fit --world-size`):
  the process is rank RANK of WORLD_SIZE as under torchrun, and only the
  ranks in ENV_REAL_RANKS run (this one alone, or several together). The
  env://, tcp:// and file:// rendezvous give it a store in which every rank
  that does not run has already done what this rank does (FakedPeersStore),
  so that init_process_group("nccl"), new_group and DeviceMesh never wait
  for one; the virtual NCCL needs no peer. Ranks together share one real
  store (a TCPStore the lowest of them serves), through which they reach
  each other. At exit the process says whether it initialized a process
  group and its role: its coordinates in the job's DeviceMesh, its pipeline
  stages (roles.py).
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import os
from datetime import timedelta
from typing import Any, Iterator

from .objects import patch_object_calls

__all__ = ["ENV_EXCHANGE", "ENV_REAL_RANKS", "ENV_WORLD", "install", "real_ranks"]

# "1" in a process that is one rank of a job whose other ranks do not all run.
ENV_WORLD = "ALLOCSCOPE_SIMULATED_WORLD"
# The ranks of that job that run, this one among them: "0,16,32,48".
ENV_REAL_RANKS = "ALLOCSCOPE_REAL_RANKS"
# A folder through which the processes of a run exchange what the virtual NCCL
# and ranks together share: small broadcasts' bytes (csrc/vgpu/nccl_exchange.h),
# communicators' running members, the port of the ranks' store.
ENV_EXCHANGE = "ALLOCSCOPE_VGPU_EXCHANGE"
# ncclUniqueId's size: what a store read of an id a rank that does not run
# would have published returns (the virtual NCCL ignores its content).
_NCCL_UNIQUE_ID_BYTES = 128
# Keys whose writer is a rank that runs, whose readers wait for it (objects.py).
_KEYS_OF_RANKS_THAT_RUN = "allocscope/objects/"


def real_ranks() -> frozenset[int] | None:
    """The ranks that run, in a process of ENV_WORLD (None: every rank runs)."""
    if os.environ.get(ENV_WORLD) != "1":
        return None
    listed = os.environ.get(ENV_REAL_RANKS) or os.environ.get("RANK", "0")
    return frozenset(int(r) for r in listed.split(",") if r.strip())


def install() -> None:
    """After torch is imported (common/torch_hook.py)."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    running = real_ranks()
    patch_object_calls(real_ranks=running)
    if running is not None:
        from .roles import record_roles

        _install_rendezvous(running)
        record_roles()
        _report_at_exit(os.environ.get("ALLOCSCOPE_WORLD_REPORT"))


# ---- ranks that do not run

class _Local:
    """The store of a rank alone: a dict, with TCPStore's semantics for what
    FakedPeersStore asks of it."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def add(self, key: str, amount: int) -> int:
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self.data.get(key)
        if current is None and expected == b"" or current == expected:
            self.data[key] = desired
            return desired
        return current if current is not None else expected

    def append(self, key: str, value: bytes) -> None:
        self.data[key] = self.data.get(key, b"") + value

    def delete_key(self, key: str) -> bool:
        return self.data.pop(key, None) is not None

    def num_keys(self) -> int:
        return len(self.data)


def _faked_peers_store_class() -> type:
    import torch.distributed as dist

    def raw(value: Any) -> bytes:
        return value if isinstance(value, bytes) else str(value).encode()

    class FakedPeersStore(dist.Store):
        """A store for the ranks of a job that run, where every rank that
        does not run is taken to have made the same calls already. `inner`
        holds what the running ranks set (a dict for a rank alone, a
        TCPStore for ranks together). A counter grows by a call's amount
        times `share`, the ranks this one stands for (together, the shares
        add up to the world size); a key no running rank has set reads as
        an NCCL unique id (all zeros), the only value torch reads from its
        peers when creating communicators, except the keys objects.py
        writes, which only running ranks are asked for, and which are
        waited for. A communicator's unique id (ProcessGroupNCCL's key for
        it, _communicator) is waited for where its root runs, and made up
        where it does not, the same in every running member; either way
        its members that run are listed for the virtual NCCL's broadcasts
        (csrc/vgpu/nccl_exchange.h)."""

        def __init__(self, inner: Any, share: int, running: frozenset[int]) -> None:
            super().__init__()
            self._inner, self._share, self._running = inner, share, running
            self._timeout = timedelta(minutes=30)

        def set(self, key: str, value: Any) -> None:
            comm = _communicator(key, self._running)
            if comm is not None:  # before the id reaches a member: its broadcasts know whom to wait for
                comm.list_running(raw(value))
            self._inner.set(key, raw(value))

        def get(self, key: str) -> bytes:
            if _KEYS_OF_RANKS_THAT_RUN in key:
                return bytes(self._inner.get(key))
            comm = _communicator(key, self._running)
            if self._inner.check([key]) or comm is not None and comm.root_runs:
                value = bytes(self._inner.get(key))  # (a running root's id: waited for)
            elif comm is not None:  # an id no running rank publishes: the same in every running member
                value = hashlib.blake2b(key.encode(), digest_size=64).digest() * 2
            else:
                return b"\0" * _NCCL_UNIQUE_ID_BYTES
            if comm is not None:
                comm.list_running(value)
            return value

        def add(self, key: str, amount: int) -> int:
            return self._inner.add(key, amount * self._share)

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            return bytes(self._inner.compare_set(key, raw(expected), raw(desired)))

        def append(self, key: str, value: Any) -> None:
            self._inner.append(key, raw(value))

        def multi_get(self, keys: list[str]) -> list[bytes]:
            return [self.get(k) for k in keys]

        def multi_set(self, keys: list[str], values: list[Any]) -> None:
            for k, v in zip(keys, values):
                self.set(k, v)

        def delete_key(self, key: str) -> bool:
            return self._inner.delete_key(key)

        def num_keys(self) -> int:
            return self._inner.num_keys()

        def check(self, keys: list[str]) -> bool:
            # Only what running ranks set: torch's watchdog checks for keys
            # other ranks set when they time out, which here never happens.
            return self._inner.check(keys)

        def wait(self, keys: list[str], timeout: Any = None) -> None:
            return None

        def set_timeout(self, timeout: timedelta) -> None:
            self._timeout = timeout

        @property
        def timeout(self) -> timedelta:
            return self._timeout

        def has_extended_api(self) -> bool:
            return True

    return FakedPeersStore


@dataclasses.dataclass(frozen=True)
class _Communicator:
    """An NCCL communicator whose unique id passes through the store: its
    members that run (their ranks in it), and whether its root (the member
    that publishes the id) runs."""

    running_members: tuple[int, ...]
    root_runs: bool

    def list_running(self, unique_id: bytes) -> None:
        """ID.running in the run's exchange folder, for the virtual NCCL
        (named by the communicator's id as the stand-in names it)."""
        folder = os.environ.get(ENV_EXCHANGE)
        if not folder:
            return
        path = os.path.join(folder, f"{_fnv1a(unique_id):016x}.running")
        text = ",".join(map(str, self.running_members))
        temporary = f"{path}.{os.getpid()}"
        with open(temporary, "w") as f:
            f.write(text)
        os.replace(temporary, path)  # whole, for a reader in another process


def _fnv1a(data: bytes) -> int:
    """csrc/vgpu/nccl_exchange.cpp's fnv1a, with its offset."""
    h = 1469598103934665603
    for byte in data:
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def _communicator(key: str, running: frozenset[int]) -> _Communicator | None:
    """The communicator whose unique id ProcessGroupNCCL keeps under `key`
    (".../GROUP/cuda/N" for a group's N-th communicator, published by its
    rank 0; ".../GROUP/cuda/A:B" for the pair of group ranks A < B of a
    point-to-point one, published by A; ".../GROUP/cuda/UniqueNCCLID:I",
    the I-th of the ids of a large group's communicator
    (ncclCommInitRankScalable), the first published by its rank 0), None for
    any other key or a group not known (yet). Of a large group's other ids
    (whose roots are spread over its ranks) the root is taken not to run:
    they are made up where no running rank has set them (the virtual NCCL
    names the communicator by the first alone)."""
    parts = [p for p in key.split("/") if p]
    if len(parts) < 3 or parts[-2] != "cuda":
        return None
    import torch.distributed.distributed_c10d as c10d

    name, last = parts[-3], parts[-1]
    ranks = next((c10d._world.pg_group_ranks.get(pg) for pg, n in c10d._world.pg_names.items() if n == name), None)
    if ranks is None and name == "0":  # the default group, its communicator made inside init_process_group
        ranks = {r: r for r in range(int(os.environ.get("WORLD_SIZE", "1")))}
    if not ranks:
        return None
    global_of = {g: r for r, g in ranks.items()}
    root_known = True
    try:
        if last.startswith("UniqueNCCLID:"):
            root_known = int(last.partition(":")[2]) == 0
            members = [global_of.get(g) for g in range(len(ranks))]
        elif ":" in last:
            members = [global_of.get(g) for g in sorted(int(p) for p in last.split(":"))]
        else:
            int(last)
            members = [global_of.get(g) for g in range(len(ranks))]
    except ValueError:  # a key of another kind
        return None
    return _Communicator(tuple(i for i, r in enumerate(members) if r in running),
                         root_known and members[0] in running)


def _share(rank: int, world: int, running: frozenset[int]) -> int:
    """The ranks `rank` stands for in the store's counters: itself, and the
    ranks that do not run for the lowest running rank."""
    return world - len(running) + 1 if rank == min(running) else 1


_stores: list[Any] = []


def _report_at_exit(path: str | None) -> None:
    """Tells `allocscope run/fit --world-size` whether the script initialized
    a process group (through a rendezvous, or with its own store)."""
    if not path:
        return
    import json

    def write() -> None:
        import torch.distributed as dist

        try:
            from .roles import describe_role

            with open(path, "w") as f:
                json.dump({"initialized": bool(_stores) or dist.is_initialized(), "role": describe_role()}, f)
        except OSError:
            pass

    atexit.register(write)


def _destroy_at_exit() -> None:
    """The process group a script left to the end of the process, destroyed
    while Python still runs: its C++ side holds this Python store, which it
    would otherwise release after the interpreter is gone (a segmentation
    fault at exit, about one run in two, seen with DeepSpeed ZeRO-3)."""
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # (the end of the process: nothing to report it to)
        pass


def _shared_store(serves: bool, timeout: timedelta) -> Any:
    """The TCPStore of ranks together: the lowest serves it on a port the
    system gives it and writes the port into the run's exchange folder, where
    the others read it (a port chosen beforehand could be taken in between,
    by any connection's local end, on a busy machine)."""
    import time

    import torch.distributed as dist

    path = os.path.join(os.environ[ENV_EXCHANGE], "store.port")
    if serves:
        store = dist.TCPStore("127.0.0.1", 0, None, True, timeout, wait_for_workers=False)
        with open(f"{path}.{os.getpid()}", "w") as f:
            f.write(str(store.port))
        os.replace(f"{path}.{os.getpid()}", path)
        return store
    deadline = time.monotonic() + timeout.total_seconds()
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError("allocscope: the lowest of the ranks run together never served their store")
        time.sleep(0.02)
    with open(path) as f:
        return dist.TCPStore("127.0.0.1", int(f.read()), None, False, timeout)


def _install_rendezvous(running: frozenset[int]) -> None:
    import importlib

    import torch.distributed as dist

    # torch.distributed.rendezvous is also the name of a function there.
    rdzv = importlib.import_module("torch.distributed.rendezvous")
    store_class = _faked_peers_store_class()

    def handler(url: str, timeout: timedelta | None = None, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
        from urllib.parse import parse_qs, urlparse

        query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
        rank, world = int(query.get("rank", -1)), int(query.get("world_size", -1))
        rank = rank if rank >= 0 else int(os.environ.get("RANK", "0"))
        world = world if world > 0 else int(os.environ.get("WORLD_SIZE", "1"))
        if len(running) > 1:  # together: one store, served by the lowest running rank
            inner: Any = _shared_store(rank == min(running), timeout or timedelta(minutes=30))
        else:
            inner = _Local()
        store = store_class(inner, _share(rank, world, running), running)
        # torch keeps only the C++ side of a Python store: without a Python
        # reference its methods would be gone when torch calls them.
        if not _stores:
            atexit.register(_destroy_at_exit)
        _stores.append(store)
        yield store, rank, world

    for scheme in ("env", "tcp", "file"):
        rdzv._rendezvous_handlers[scheme] = handler
