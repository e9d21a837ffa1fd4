"""Watching without a watch() call (Recording.auto_watch(); `allocscope fit`
and the gpu_memory marker use it): a model is watched when it is first
called outside any other module, and an optimizer joins the watch of the
model whose parameters it steps, at its first step.

Not a model of its own: a module called during backward (activation
checkpointing recomputes blocks there, outside their model's call), and a
module that is part of a watched model or holds one (torch.compile's
wrapper around a model the script watched before compiling it). Watching
those would count parameters twice, and hooks on a recomputed block would
change what checkpointing keeps.

Global hooks (torch.nn.modules.module.register_module_forward_pre_hook and
its siblings, torch.optim.optimizer.register_optimizer_step_pre_hook) see
every call; each costs a Python call and a dict lookup once its model is
watched. A model the script watches itself is left to that watch.
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from typing import Any, Callable

from .phases import Phases

__all__ = ["AutoWatch"]

_COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


class AutoWatch:
    def __init__(self, watch: Callable[..., Any], watches: Callable[[], list[Any]]):
        """watch(model) makes a Watch; watches() lists the recording's
        watches (the script's own included)."""
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._watch, self._watches = watch, watches
        # Inside a torch.compile'd region the hooks do nothing: traced into
        # its graph, they would break it (Watch's module hooks do the same),
        # except on a model compiled in place (module.compile()), whose own
        # call is the compiled region: its hooks run outside the graph (one
        # break, before its first op), or it would never be watched.
        self._compiling = torch.compiler.is_compiling
        self._pre_outside_graph = torch.compiler.disable(self._pre)
        self._post_outside_graph = torch.compiler.disable(self._post)
        self._local = threading.local()  # per thread: how deep in module calls
        # Keyed by the objects, not their ids: an id is reused once its object is gone.
        self._models: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()  # model -> Watch or None
        self._optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, always_call=True),
            register_optimizer_step_pre_hook(self._step),
        ]
        # torch warns, when a compiled model is called, that global module
        # hooks fire for its wrapper too: these hooks are allocscope's, and
        # they know (the wrapper holds the model: _covered).
        warnings.filterwarnings("ignore", _COMPILE_WARNING, UserWarning)
        self._filter = warnings.filters[0]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._filter in warnings.filters:
            warnings.filters.remove(self._filter)
            # What filterwarnings itself calls, so that decisions cached under the filter are dropped (private:
            # where it is missing, the warning stays off where it was already ignored).
            getattr(warnings, "_filters_mutated", lambda: None)()

    def _pre(self, module: Any, args: Any) -> None:
        if self._compiling():
            if getattr(module, "_compiled_call_impl", None) is not None:
                self._pre_outside_graph(module, args)
            return
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth or module in self._models or Phases.in_backward:
            return
        try:
            if next(module.parameters(), None) is None or self._covered(module):
                self._models[module] = None  # no model (a loss module, say), or one watched already
                return
            w = self._models[module] = self._watch(module)
            w.entered(module, args)  # its own hooks start with the next call: this one is under way
        except Exception as e:  # never break the program's forward
            self._give_up(e)

    def _covered(self, module: Any) -> bool:
        """Whether module is, is part of, or holds a watched model."""
        watched = [w.model for w in self._watches()]
        mine = {id(m) for m in module.modules()}
        return any(m is not None and (id(m) in mine or any(sub is module for sub in m.modules())) for m in watched)

    def _give_up(self, error: Exception) -> None:
        print(f"allocscope: auto-watch stopped: {type(error).__name__}: {error}", file=sys.stderr)
        self.remove()

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self._compiling():
            if getattr(module, "_compiled_call_impl", None) is not None:
                self._post_outside_graph(module, args, output)
            return
        self._local.depth = max(getattr(self._local, "depth", 1) - 1, 0)

    def _step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer in self._optimizers:
            return
        self._optimizers.add(optimizer)
        try:
            params = {id(p) for group in optimizer.param_groups for p in group["params"]}
            for w in list(self._models.values()):
                if w is not None and w.owns_any(params):
                    w.add_optimizer(optimizer)  # its step hooks run in this step already
                    return
        except Exception as e:  # never break the program's step
            self._give_up(e)
