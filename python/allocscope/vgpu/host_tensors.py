"""Device tensors seen from the host, on the virtual GPU (values.py): CPU tensors over the same bytes, which
storages hold values, and the host's random generators that stand for the device's."""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

__all__ = ["GENERATORS", "REGISTRY", "Registry", "covers_storage", "host_alias", "on_cuda", "tensors_in", "to_host",
           "wrapped_number"]


class Registry:
    """The storages that hold values, by id, each with a weak reference whose callback forgets it: torch keeps
    a storage's Python object for as long as the storage lives (and makes it once asked), so the entry goes
    exactly when the storage does, and an id reused later names a new storage."""

    def __init__(self) -> None:
        self._held: dict[int, weakref.ref] = {}
        # storages filled by a fill_ or zero_ not yet written (see fill_later): id -> (host view, value)
        self._fills: dict[int, tuple[torch.Tensor, Any]] = {}

    def holds(self, t: torch.Tensor) -> bool:
        try:
            return id(t.untyped_storage()) in self._held
        except (RuntimeError, NotImplementedError):  # a tensor without storage
            return False

    def set(self, t: torch.Tensor, held: bool) -> None:
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = id(s)
        self._fills.pop(key, None)
        if held:
            if key not in self._held:
                self._held[key] = weakref.ref(s, functools.partial(_forget, self, key))
        else:
            self._held.pop(key, None)

    def fill_later(self, t: torch.Tensor, value: Any) -> None:
        """t, which covers its storage, holds `value` everywhere: written when a computed op first reads it
        (write_fills), not now. A large fill is most often a kernel's scratch or an activation's start, never
        read on the host: written now, its pages would stay in the host's memory."""
        self.set(t, True)
        self._fills[id(t.untyped_storage())] = (host_alias(t), value)

    def write_fills(self, ts: Any) -> None:
        """Writes the pending fills of these tensors' storages, before a computed op reads them."""
        if not self._fills:
            return
        for t in ts:
            try:
                pending = self._fills.pop(id(t.untyped_storage()), None)
            except (RuntimeError, NotImplementedError):
                continue
            if pending is not None:
                pending[0].fill_(pending[1])


def _forget(registry: Registry, key: int, _ref: weakref.ref) -> None:
    registry._held.pop(key, None)
    registry._fills.pop(key, None)


REGISTRY = Registry()


def host_alias(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same bytes as `t` (on the virtual GPU, device memory is host memory)."""
    storage = t.untyped_storage()
    cpu = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), torch.device("cpu"), storage.nbytes())
    return torch.empty(0, dtype=t.dtype).set_(cpu, t.storage_offset(), t.size(), t.stride())


def tensors_in(values: Any) -> list[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, torch.Tensor))
    return out


def on_cuda(values: Any) -> list[torch.Tensor]:
    return [t for t in tensors_in(values) if t.is_cuda]


def to_host(v: Any, generator: torch.Generator | None) -> Any:
    if isinstance(v, torch.Tensor):
        return host_alias(v) if v.is_cuda else v
    if isinstance(v, (list, tuple)):
        return type(v)(to_host(x, generator) for x in v)
    if isinstance(v, torch.device) and v.type == "cuda":
        return torch.device("cpu")
    if isinstance(v, torch.Generator):
        return generator
    return v


def wrapped_number(v: Any) -> torch.Tensor:
    # A number passed where a Tensor is expected arrives here as a Python number (torch unwraps "wrapped
    # numbers" for Python kernels) and must go back as a tensor; a 0-dim one of the default dtype of its kind
    # promotes as the wrapped number did.
    if isinstance(v, bool):
        return torch.tensor(v)
    if isinstance(v, int):
        return torch.tensor(v, dtype=torch.int64)
    if isinstance(v, complex):
        return torch.tensor(v, dtype=torch.complex64 if torch.get_default_dtype() == torch.float32
                            else torch.complex128)
    return torch.tensor(v, dtype=torch.get_default_dtype())


def covers_storage(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.storage_offset() == 0 and t.nbytes == t.untyped_storage().nbytes()


class Generators:
    """A CPU generator per CUDA device, seeded from the device's CUDA generator and seeded again when that is:
    random values on the virtual GPU are as repeatable as on a card (not the card's Philox stream)."""

    def __init__(self) -> None:
        self._by_device: dict[int, tuple[int, torch.Generator]] = {}

    def for_device(self, device: int) -> torch.Generator:
        seed = torch.cuda.default_generators[device].initial_seed()
        held = self._by_device.get(device)
        if held is None or held[0] != seed:
            g = torch.Generator()
            g.manual_seed(seed)
            held = self._by_device[device] = (seed, g)
        return held[1]


GENERATORS = Generators()
