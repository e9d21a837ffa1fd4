"""Device tensors seen from the host, on the virtual GPU (values.py): CPU tensors over the same bytes, which
storages hold values, and the host's random generators that stand for the device's."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GENERATORS", "REGISTRY", "Registry", "covers_storage", "host_alias", "on_cuda", "tensors_in", "to_host",
           "wrapped_number"]


class Registry:
    """Which storages hold values, kept by the extension (csrc/recorder/value_kernels.cpp) by data pointer and
    forgotten at the caching allocator's free of their block. Not by a storage's Python object: once made, it
    holds a reference to the storage for the storage's whole life, and autograd then accumulates gradients out
    of place (a tensor is stolen only where nothing else references its storage): an allocation a card does
    not make."""

    def __init__(self) -> None:
        self._native: Any = None

    def _c(self) -> Any:
        if self._native is None:
            from ..common.native import native

            self._native = native()
        return self._native

    def holds(self, t: torch.Tensor) -> bool:
        return self._c().values_held(t)

    def set(self, t: torch.Tensor, held: bool) -> None:
        self._c().values_set_held(t, held)

    def fill_later(self, t: torch.Tensor, value: Any) -> None:
        """t, which covers its storage, holds `value` everywhere: written when a computed op first reads it
        (write_fills), not now. A large fill is most often a kernel's scratch or an activation's start, never
        read on the host: written now, its pages would stay in the host's memory."""
        self._c().values_fill_later(t, value)

    def write_fills(self, ts: Any) -> None:
        """Writes the pending fills of these tensors' storages, before a computed op reads them."""
        write = self._c().values_write_fill
        for t in ts:
            write(t)

    def track_frees(self) -> bool:
        """Forgets storages as the allocator frees their blocks, from now on (CUDA initialized); False where
        the allocator does not say (cudaMallocAsync)."""
        return self._c().values_track_frees()

    def span(self, t: torch.Tensor) -> tuple[int, int]:
        """(data pointer, bytes) of t's storage."""
        return self._c().values_storage_span(t)


REGISTRY = Registry()


def host_alias(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same bytes as `t` (on the virtual GPU, device memory is host memory)."""
    ptr, nbytes = REGISTRY.span(t)
    cpu = torch._C._construct_storage_from_data_pointer(ptr, torch.device("cpu"), nbytes)
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
    return t.is_contiguous() and t.storage_offset() == 0 and t.nbytes == REGISTRY.span(t)[1]


class Generators:
    """A CPU generator per CUDA device, seeded for each random op from the device's CUDA generator: its seed and
    its Philox offset, which torch's own CUDA kernel advanced as on a card. So random values on the virtual GPU
    are as repeatable as on a card, and manual_seed starts them over (they are not the card's Philox stream)."""

    def __init__(self) -> None:
        self._by_device: dict[int, torch.Generator] = {}

    def for_device(self, device: int) -> torch.Generator:
        cuda = torch.cuda.default_generators[device]
        g = self._by_device.get(device)
        if g is None:
            g = self._by_device[device] = torch.Generator()
        g.manual_seed(hash((cuda.initial_seed(), cuda.get_offset())) & ((1 << 63) - 1))
        return g


GENERATORS = Generators()
