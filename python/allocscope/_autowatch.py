"""Watching without a watch() call (Recording.auto_watch(); `allocscope fit`
and the gpu_memory marker use it): a model is watched when it is first
called outside any other module, and an optimizer joins the watch of the
model whose parameters it steps, at its first step.

Global hooks (torch.nn.modules.module.register_module_forward_pre_hook and
its siblings, torch.optim.optimizer.register_optimizer_step_pre_hook) see
every call; each costs a Python call and a dict lookup once its model is
watched. A model the script watches itself is left to that watch.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["AutoWatch"]


class AutoWatch:
    def __init__(self, watch: Callable[..., Any], watched: Callable[[Any], Any]):
        """watch(model) makes a Watch; watched(model) is the Watch already on
        model (the script's own), or None."""
        from torch.nn.modules import module as nn_module
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._watch, self._watched = watch, watched
        self._local = threading.local()  # per thread: how deep in module calls
        self._models: dict[int, Any] = {}  # id(model) -> its Watch
        self._optimizers: set[int] = set()
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, always_call=True),
            register_optimizer_step_pre_hook(self._step),
        ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre(self, module: Any, args: Any) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth or id(module) in self._models:
            return
        if self._watched(module) is not None or next(module.parameters(), None) is None:
            self._models[id(module)] = None  # the script's own watch, or no model (a loss module, say)
            return
        w = self._models[id(module)] = self._watch(module)
        w.entered(module, args)  # its own hooks start with the next call: this one is under way

    def _post(self, module: Any, args: Any, output: Any) -> None:
        self._local.depth = max(getattr(self._local, "depth", 1) - 1, 0)

    def _step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if id(optimizer) in self._optimizers:
            return
        self._optimizers.add(id(optimizer))
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for w in self._models.values():
            if w is not None and w.owns_any(params):
                w.add_optimizer(optimizer)  # its step hooks run in this step already
                return
