"""Watching without a watch() call (Recording.auto_watch(); `allocscope run`,
`allocscope fit` and the gpu_memory marker use it): a model is watched when
it is first called outside any other module, and an optimizer joins the
watch of the model whose parameters it steps, at its first step.

Not a model of its own: a module called during backward (activation
checkpointing recomputes blocks there, outside their model's call), and a
module that is part of a watched model or holds one (a wrapper around a
model the script watched before wrapping it). Watching those would count
parameters twice, and hooks on a recomputed block would change what
checkpointing keeps.

It sees every module call and optimizer step through the process's global
hooks (global_hooks.py: the observer, called before the watches' own
entries, so a model's first call is already watched). What it remembers of
the program's modules and optimizers it holds weakly. A model the script
watches itself is left to that watch.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .global_hooks import GlobalHooks, Observer, WeakIdentityMap
from .phases import Phases

__all__ = ["AutoWatch"]


class AutoWatch(Observer):
    def __init__(self, watch: Callable[..., Any], watches: Callable[[], list[Any]]):
        """watch(model) makes a Watch; watches() lists the recording's
        watches (the script's own included)."""
        self._watch, self._watches = watch, watches
        self._local = threading.local()  # per thread: how deep in module calls
        # model -> its Watch, or None (not a model, or covered by another watch)
        self._models = WeakIdentityMap()
        self._optimizers = WeakIdentityMap()  # optimizers seen stepping
        GlobalHooks.set_observer(self)

    def remove(self) -> None:
        if GlobalHooks.observer is self:
            GlobalHooks.set_observer(None)

    def pre(self, module: Any, args: Any) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth or Phases.in_backward or self._models.contains(module):
            return
        if next(module.parameters(), None) is None or self._covered(module):
            self._models.set(module, None)  # no model (a loss module, say), or one watched already
            return
        self._models.set(module, self._watch(module))

    def post(self, module: Any, args: Any, output: Any) -> None:
        self._local.depth = max(getattr(self._local, "depth", 1) - 1, 0)

    def step(self, optimizer: Any) -> None:
        if self._optimizers.contains(optimizer):
            return
        self._optimizers.set(optimizer, None)
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for w in self._models.values():
            if w is not None and w.owns_any(params):
                w.add_optimizer(optimizer)  # its step hooks run in this step already
                return

    def _covered(self, module: Any) -> bool:
        """Whether module is, is part of, or holds a watched model."""
        watched = [w.model for w in self._watches()]
        mine = {id(m) for m in module.modules()}
        return any(m is not None and (id(m) in mine or any(sub is module for sub in m.modules())) for m in watched)
