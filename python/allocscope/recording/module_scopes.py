"""What a watched module's scopes are made of: the tensors in its inputs
and outputs, their storages, and a leaf's new output bytes (the textbook's
"layer outputs"). The scopes themselves are written by the C functions of
csrc/recorder/module_hooks.h, called from the process's global hooks
(global_hooks.py); new_output_bytes is their Python reference and their
fallback for outputs that are not one plain tensor."""

from __future__ import annotations

from typing import Any, Iterator

__all__ = ["new_output_bytes", "storage", "tensors"]


def tensors(value: Any) -> Iterator[tuple[str, Any]]:
    """(path, tensor) for every tensor in nested tuples, lists and dicts."""
    import torch

    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, torch.Tensor):
            yield path, v
        elif isinstance(v, (tuple, list)):
            stack.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
        elif isinstance(v, dict):
            stack.extend((f"{path}[{k!r}]", x) for k, x in reversed(list(v.items())))


def storage(t: Any) -> tuple[int, int] | None:
    """(data pointer, bytes) of a tensor's storage, or None for tensors
    without one (sparse, meta, wrapper subclasses)."""
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def new_output_bytes(args: Any, output: Any) -> int:
    """Bytes of a module's output tensors that are neither its inputs nor
    views of them (ReLU(inplace=True), Flatten): the layer's new memory."""
    import torch

    if isinstance(output, torch.Tensor) and len(args) == 1 and isinstance(args[0], torch.Tensor):
        try:  # the common case, without generators
            same = output.untyped_storage().data_ptr() == args[0].untyped_storage().data_ptr()
            return 0 if same else output.numel() * output.element_size()
        except (RuntimeError, NotImplementedError, TypeError):
            return 0
    inputs = {s[0] for s in (storage(t) for _, t in tensors(args)) if s is not None}
    produced = 0
    for _, t in tensors(output):
        s = storage(t)
        if s is not None and s[0] not in inputs:
            produced += t.numel() * t.element_size()
    return produced
