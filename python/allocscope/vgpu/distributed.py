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
  (None without one), `recv_object_list` leaves the list as it was
  (objects.py; a pipeline stage's peers send it their shapes that way).

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

from .objects import patch_object_calls

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
    patch_object_calls(alone=os.environ.get(ENV_WORLD) == "1")
    if os.environ.get(ENV_WORLD) == "1":
        _install_lone_rendezvous()
        _report_at_exit(os.environ.get("ALLOCSCOPE_WORLD_REPORT"))


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
