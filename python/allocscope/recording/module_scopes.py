"""How a watched model's modules (the root's aside) write their scopes.

Each call of a watched module writes MODULE_ENTER before its forward and
MODULE_EXIT after (a leaf's with the bytes of its new outputs). Forward hooks
would do it, but a module with hooks takes Module._call_impl's slow path:
26.7 thousand instructions a call with hooks that do nothing against 9.8
thousand without (callgrind, benchmarks/bench_module_call_instructions.py).
So the watcher wraps the module's forward instead, as accelerate's hooks do:
the module's instance attribute `forward` becomes a functools.partial of the
class's forward and the module, of a type whose call (C,
csrc/recorder/module_hooks.h) writes the scopes around it. Module.__call__
keeps its fast path, and a watched call costs no Python frame of
allocscope's (a Python wrapper that called C functions cost 5.3 thousand
instructions a call over an unwatched one; the C partial, see
results/module_call_instructions_issue29_s9.json). The Python wrapper
remains where this Python's partial is not laid out as the C type needs.

What the wrapper keeps of the module as it was:
- its signature (inspect.signature reads a partial's as a bound method's:
  Hugging Face reads forward's parameters), and a bound method's __self__,
  __func__ and __name__;
- copy.deepcopy and pickling: the wrapper reduces to getattr(module,
  "forward"), so a pickle holds nothing of allocscope and unpickles as the
  class's forward, and a deep copy runs the class's forward on the copy;
- torch.compile: Dynamo reads a partial as the call it stands for and traces
  the class's forward alone (no graph break; the Python wrapper checks
  torch.compiler.is_compiling() instead);
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

    In C where this Python allows (`_C.wrap_forward`: a functools.partial of
    the class's forward and the module, whose call writes the scopes; the
    `in_c` class attribute False is the Python wrapper below, its reference).
    The Python wrapper calls enter(module, args) and leave(module, args,
    output), the C functions of `_C.module_hooks`; leave returns False for a
    leaf whose new output bytes it cannot read, which annotate then writes
    from Python."""

    in_c = True

    def __init__(self, module: Any, name: str, leaf: bool, native: Any, annotate: Callable[..., Any]) -> None:
        cls_forward = type(module).forward
        self._module = weakref.ref(module)  # (the watch holds its model weakly)
        wrapper = native.wrap_forward(cls_forward, module, name, leaf, new_output_bytes) if self.in_c else None
        if wrapper is not None:
            # As a bound method reads (its __self__ and __func__ are the type's)
            vars(wrapper).update(__name__=cls_forward.__name__, __qualname__=cls_forward.__qualname__,
                                 __doc__=cls_forward.__doc__, __module__=cls_forward.__module__)
            # (weakly: the wrapper holds the module, which the watch does not keep alive)
            self._forward: Any = weakref.ref(wrapper)
            self._stop = lambda: _stop_wrapper(self._forward())
            module.forward = wrapper
            return
        forward = self._python_forward(module, name, leaf, *native.module_hooks(name, leaf), annotate)
        self._forward = lambda: forward
        module.forward = forward.__get__(module)

    def _python_forward(self, module: Any, name: str, leaf: bool, enter: Callable[..., Any],
                        leave: Callable[..., bool], annotate: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        flags = MODULE_LEAF if leaf else 0
        is_compiling = torch.compiler.is_compiling
        cls_forward = type(module).forward
        live = [True]  # emptied by remove(): a wrapper someone else wrapped since runs the forward alone
        self._stop = live.clear

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
        return forward

    def remove(self) -> None:
        self._stop()
        module = self._module()
        if module is None:
            return
        forward, ours = module.__dict__.get("forward"), self._forward()
        if ours is not None and (forward is ours or getattr(forward, "__func__", None) is ours):
            del module.__dict__["forward"]


def _stop_wrapper(wrapper: Any) -> None:
    if wrapper is not None:
        wrapper._allocscope_stop()
