"""The phase (forward, backward, optimizer, other) and the optimizer-step
count that all of a process's watches share, so that two watched models (a
model and its loss module, say) write one sequence of phases; and the
wrapper around torch.autograd.backward/grad that marks the backward phase,
installed while anything is watched (watcher.py)."""

from __future__ import annotations

import weakref
from typing import Any

from ..capture.format import EventKind
from ..common.native import native

__all__ = ["Phases"]

_PHASE = int(EventKind.PHASE)
_registered_builtins = False


class Phases:
    """What all watches share: the phase and iteration (one per process, so
    that two watched models, a model and its loss module say, write one
    sequence of phases), and the wrapper around torch.autograd.backward,
    installed while anything is watched."""

    watches: "weakref.WeakSet[Any]" = weakref.WeakSet()  # the live Watch objects (only counted here)
    original_backward: Any = None
    original_grad: Any = None
    phase = "other"
    iteration = 0
    in_backward = False
    # Called before each forward phase begins (the recording's
    # checkpoint_if_due, set when a watch starts; session.py).
    before_forward: Any = None

    @classmethod
    def add(cls, w: Any) -> None:
        import torch.autograd

        if not cls.watches:  # a new recording starts from scratch
            cls.phase, cls.iteration, cls.in_backward = "other", 0, False
        cls.watches.add(w)
        if cls.original_backward is None:
            cls.original_backward = torch.autograd.backward
            torch.autograd.backward = cls._backward  # type: ignore[assignment]
            cls.original_grad = torch.autograd.grad
            torch.autograd.grad = cls._grad  # type: ignore[assignment]
            _as_torchscript_builtins()

    @classmethod
    def discard(cls, w: Any) -> None:
        import torch.autograd

        cls.watches.discard(w)
        if not cls.watches and cls.original_backward is not None:
            if torch.autograd.backward is cls._backward:
                torch.autograd.backward = cls.original_backward
            if torch.autograd.grad is cls._grad:
                torch.autograd.grad = cls.original_grad
            cls.original_backward = cls.original_grad = None

    @classmethod
    def set_phase(cls, phase: str, *, force: bool = False) -> None:
        if phase != cls.phase or force:
            cls.phase = phase
            if phase == "forward" and cls.before_forward is not None:
                cls.before_forward()  # an iteration starts: where a report of its steps starts reading
            native().annotate(_PHASE, phase, cls.iteration, 0, False)

    @classmethod
    def enter_backward(cls) -> None:
        cls.in_backward = True
        cls.set_phase("backward")

    @classmethod
    def leave_backward(cls) -> None:
        cls.in_backward = False
        cls.set_phase("other")

    @staticmethod
    def _backward(*args: Any, **kwargs: Any) -> Any:
        return Phases._in_backward_phase(Phases.original_backward, args, kwargs)

    @staticmethod
    def _grad(*args: Any, **kwargs: Any) -> Any:
        return Phases._in_backward_phase(Phases.original_grad, args, kwargs)

    @staticmethod
    def _in_backward_phase(original: Any, args: Any, kwargs: Any) -> Any:
        nested = Phases.in_backward  # (a backward inside a backward hook, or a reentrant checkpoint's)
        if not nested:
            Phases.enter_backward()
        # Inside a node, the node's backward scope stays open under the
        # nested backward's (csrc/recorder/backward_scopes.h)
        inside_node = nested and native().backward_nested_begin()
        try:
            return original(*args, **kwargs)
        finally:
            if inside_node:
                native().backward_nested_end()
            if not nested:
                Phases.leave_backward()


def _as_torchscript_builtins() -> None:
    """TorchScript knows torch.autograd.grad and backward by identity
    (torch/jit/_builtins.py) and would try to compile the wrappers as Python
    functions, which it refuses (they take *args). Registered as the same
    builtins, a scripted function that calls them compiles to aten::grad and
    aten::backward as it does unwatched; its calls then do not pass through
    the wrappers (no backward phase is marked for them). Once per process:
    the table holds ids, and the wrappers live as long as the process."""
    global _registered_builtins
    if _registered_builtins:
        return
    _registered_builtins = True
    try:
        from torch.jit import _builtins
    except ImportError:
        return
    for fn, op in ((Phases._backward, "aten::backward"), (Phases._grad, "aten::grad")):
        pending = getattr(_builtins, "_builtin_ops", None)
        if getattr(_builtins, "_builtin_table", None) is None and isinstance(pending, list):
            pending.append((fn, op))  # the table is made from these when TorchScript first needs it
        else:
            _builtins._register_builtin(fn, op)
