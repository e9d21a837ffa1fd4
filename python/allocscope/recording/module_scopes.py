"""How a watched model's modules (the root's aside) write their scopes.

Each call of a watched module writes MODULE_ENTER before its forward and
MODULE_EXIT after (a leaf's with the bytes of its new outputs). Forward hooks
would do it, but a module with hooks takes Module._call_impl's slow path:
26.7 thousand instructions a call with hooks that do nothing against 9.8
thousand without (callgrind, benchmarks/bench_module_call_instructions.py).
So the watcher wraps the module's forward instead, as accelerate's hooks do:
the module's instance attribute `forward` becomes a bound method of a
wrapper that writes the scopes (C functions, csrc/recorder/module_hooks.h)
around the class's forward. Module.__call__ keeps its fast path.

What the wrapper keeps of the module as it was:
- bound to the module (a bound method in its __dict__): copy.deepcopy binds
  the copy's to the copy, and pickling stores getattr(module, "forward"),
  which unpickles without allocscope as the class's forward;
- its signature (inspect.signature follows __wrapped__ to the class's
  forward: Hugging Face reads forward's parameters);
- torch.compile: inside a compiled region it only calls the forward (an
  annotation, a call into C, would break the graph);
- an exception: MODULE_EXIT is written as a forward hook with
  always_call=True would write it (for Exception, not BaseException).

The wrapper runs inside Module.__call__, after the module's forward
pre-hooks and before its forward hooks; a forward hook's allocations are
its parent's, where hooks registered after the watch's made them the
module's. A module that already has an instance `forward` (someone else's
wrapper) or whose class's forward is not a plain function (a staticmethod,
a container's placeholder) gets the hooks instead. The
wrapper holds the module (a reference cycle, as accelerate's): the watch's
removal (the recording's end) deletes it.
"""

from __future__ import annotations

import functools
import inspect
import types
import weakref
from typing import Any, Callable, Iterator

from ..capture.format import MODULE_LEAF, EventKind

__all__ = ["ForwardWrapper", "can_wrap", "new_output_bytes", "storage", "tensors"]

# Plain ints for the hot path (IntEnum members convert on every call)
_EXIT = int(EventKind.MODULE_EXIT)


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


def can_wrap(module: Any) -> bool:
    """Whether the module's forward can be wrapped: its class defines one as
    a plain function (not a staticmethod, a script method or a container's
    placeholder) and nothing has put a forward in the instance already."""
    import torch

    forward = inspect.getattr_static(type(module), "forward", None)  # (a staticmethod as it is)
    return ("forward" not in module.__dict__ and isinstance(forward, types.FunctionType)
            and forward is not torch.nn.Module.forward)


class ForwardWrapper:
    """The wrapped forward of one module; remove() puts the class's back.
    enter(module, args) and leave(module, args, output) are the C
    functions; leave returns False for a leaf whose new output bytes it
    cannot read, which annotate then writes from Python."""

    def __init__(self, module: Any, name: str, leaf: bool, enter: Callable[..., Any], leave: Callable[..., bool],
                 annotate: Callable[..., Any]) -> None:
        import torch

        flags = MODULE_LEAF if leaf else 0
        is_compiling = torch.compiler.is_compiling
        cls_forward = type(module).forward
        live = [True]  # emptied by remove(): a wrapper someone else wrapped since runs the forward alone
        self._live = live

        def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            if not live or is_compiling():
                return cls_forward(module, *args, **kwargs)
            enter(module, args)
            try:
                output = cls_forward(module, *args, **kwargs)
            except Exception:
                if not leave(module, args, None):
                    annotate(_EXIT, name, flags, 0, False)
                raise
            if not leave(module, args, output):  # a leaf whose output is not one plain tensor
                annotate(_EXIT, name, flags, new_output_bytes(args, output), False)
            return output

        # (__name__ "forward": a pickled bound method is getattr(module, __name__))
        functools.update_wrapper(forward, cls_forward)
        self._forward = forward
        self._module = weakref.ref(module)  # (the watch holds its model weakly)
        module.forward = forward.__get__(module)

    def remove(self) -> None:
        self._live.clear()
        module = self._module()
        if module is not None and getattr(module.__dict__.get("forward"), "__func__", None) is self._forward:
            del module.__dict__["forward"]
