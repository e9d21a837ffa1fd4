"""The process's global module and optimizer hooks, through which every
watch sees its model's calls and its optimizers' steps.

A watch must leave nothing on the user's objects: a hook in a module's
`_forward_hooks`, a wrapped `forward` in its `__dict__` or a step hook in an
optimizer's dicts would be pickled with it (`torch.save(model)`), copied by
`copy.deepcopy`, seen by whoever inspects the hooks, traced by FX and
TorchScript, and would keep the object alive in a reference cycle after the
program dropped it. So the watches register nothing on the objects. One
pair of torch's global forward hooks (`register_module_forward_pre_hook`,
`register_module_forward_hook(always_call=True)`) and one pair of global
optimizer step hooks, installed while anything is watched, look each module
or optimizer up by identity in a table that holds it weakly, and call what
its watch registered for it. An object the program drops is freed as
unwatched; its entries go with it.

What it costs: a module with any hook, global hooks included, takes
`Module._call_impl`'s slow path, so every module call of the process pays
it while a watch lives, watched or not (docs/benchmarks.md, "What watching
costs"). Global forward hooks run before a module's own, so a program's
hooks keep their order among themselves; a module's forward pre-hooks run
inside its scope, its forward hooks after the scope has ended.

torch.compile traces global hooks into its graphs: inside a compiled
region they do nothing (`torch.compiler.is_compiling()`, a constant to
Dynamo, so the graphs are those of the program unwatched). A model compiled
with `torch.compile(model)` is called through its wrapper
(`OptimizedModule`), whose call runs eagerly: the watch sees the wrapper's
call as its model's. A model compiled in place (`model.compile()`) has no
eager call: its hooks run outside the graph (`torch.compiler.disable`: one
graph break, before its first op).
"""

from __future__ import annotations

import sys
import warnings
import weakref
from typing import Any, Callable

from ..common.torch_hook import after_import

__all__ = ["GlobalHooks", "Observer", "WeakIdentityMap"]

# (module, args) -> None; (module, args, output) -> True where it wrote
# what it had to (a leaf's scope whose output bytes the C function could not
# read returns False: Watch then writes it from Python).
PreHook = Callable[[Any, Any], Any]
PostHook = Callable[[Any, Any, Any], Any]
StepHook = Callable[[Any, Any, Any], Any]

# torch warns, when a compiled model is called, that global module hooks
# fire for its wrapper too: these are allocscope's, and they know (_watched).
_COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


class Observer:
    """What sees every module call and optimizer step, watched or not
    (AutoWatch). Called before the watches' own entries, so that a model it
    watches at its first call has that call watched."""

    def pre(self, module: Any, args: Any) -> None: ...

    def post(self, module: Any, args: Any, output: Any) -> None: ...

    def step(self, optimizer: Any) -> None: ...


class WeakIdentityMap:
    """A map from objects, by identity, that holds them weakly: an entry
    goes when its object does. (A WeakKeyDictionary hashes and compares
    its keys: a module class may define __eq__, and then has no hash.) An
    id is reused once its object is gone, so each entry keeps a weak
    reference that says whether an object is the one it was made for."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ref[Any], Any]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def get(self, obj: Any, default: Any = None) -> Any:
        found = self._items.get(id(obj))
        if found is None or found[0]() is not obj:
            return default
        return found[1]

    def contains(self, obj: Any) -> bool:
        found = self._items.get(id(obj))
        return found is not None and found[0]() is obj

    def set(self, obj: Any, value: Any) -> None:
        key = id(obj)
        found = self._items.get(key)
        if found is not None and found[0]() is obj:
            self._items[key] = (found[0], value)
            return
        items = self._items

        def forget(ref: weakref.ref[Any], key: int = key) -> None:
            current = items.get(key)
            if current is not None and current[0] is ref:
                del items[key]

        self._items[key] = (weakref.ref(obj, forget), value)

    def values(self) -> list[Any]:
        return [v for ref, v in list(self._items.values()) if ref() is not None]

    def filter_values(self, keep: Callable[[Any], Any]) -> None:
        """Replaces each value v by keep(v); drops the entries where that is falsy."""
        for key, (ref, value) in list(self._items.items()):
            kept = keep(value)
            # (an object dying meanwhile: its entry went, or goes, with it)
            if kept and ref() is not None and self._items.get(key, (None,))[0] is ref:
                self._items[key] = (ref, kept)
            elif self._items.get(key, (None,))[0] is ref:
                del self._items[key]

    def clear(self) -> None:
        self._items.clear()


class _Entry:
    __slots__ = ("owner", "pre", "post")

    def __init__(self, owner: Any, pre: Any, post: Any):
        self.owner, self.pre, self.post = owner, pre, post


def _add(table: WeakIdentityMap, obj: Any, entry: _Entry) -> None:
    entries = table.get(obj)
    if entries is None:
        table.set(obj, [entry])
    else:
        entries.append(entry)


class GlobalHooks:
    """The one set of global hooks (a class: one per process). Installed
    when the first entry or observer comes, removed with the last."""

    modules = WeakIdentityMap()  # module -> [_Entry]
    optimizers = WeakIdentityMap()  # optimizer -> [_Entry]
    observer: Observer | None = None
    _handles: list[Any] = []
    _filter: Any = None
    _failed = False

    # ---- what watches call

    @classmethod
    def add_module(cls, module: Any, owner: Any, pre: PreHook, post: PostHook) -> None:
        _add(cls.modules, module, _Entry(owner, pre, post))
        cls._install()

    @classmethod
    def add_optimizer(cls, optimizer: Any, owner: Any, pre: StepHook, post: StepHook) -> None:
        _add(cls.optimizers, optimizer, _Entry(owner, pre, post))
        cls._install()

    @classmethod
    def remove_owner(cls, owner: Any) -> None:
        def others(entries: list[_Entry]) -> list[_Entry]:
            return [e for e in entries if e.owner is not owner]

        cls.modules.filter_values(others)
        cls.optimizers.filter_values(others)
        cls._uninstall_if_idle()

    @classmethod
    def set_observer(cls, observer: Observer | None) -> None:
        cls.observer = observer
        if observer is None:
            cls._uninstall_if_idle()
        else:
            cls._install()

    @classmethod
    def installed(cls) -> bool:
        return bool(cls._handles)

    # ---- installing

    @classmethod
    def _install(cls) -> None:
        if cls._handles:
            return
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        cls._failed = False
        is_compiling = torch.compiler.is_compiling
        # What a model compiled in place runs outside the graph. Made once
        # torch._dynamo is imported (by the first torch.compile): making
        # them imports it, and a program that never compiles must not find
        # it imported (a weights_only load of a nested tensor needs the
        # program to import it, or refuses).
        outside: list[Any] = [None, None]

        def make_outside() -> None:
            outside[:] = [torch.compiler.disable(_pre), torch.compiler.disable(_post)]

        after_import("torch._dynamo", make_outside)

        # (Dynamo traces these two into compiled graphs: under is_compiling()
        # they touch no table, or its guards would follow every watch)
        # Outside a compiled region, each is _pre or _post written out (a
        # call fewer on every module call of the process).
        modules, hooks, inner = _modules, GlobalHooks, _inner

        def module_pre_hook(module: Any, args: Any) -> None:
            if is_compiling():
                if module._compiled_call_impl is not None:  # compiled in place: its own call is the graph
                    outside[0](module, args)
                return
            try:
                if type(module).__name__ == "OptimizedModule":
                    module = inner(module)
                observer = hooks.observer
                if observer is not None:
                    observer.pre(module, args)
                found = modules.get(id(module))
                if found is not None and found[0]() is module:
                    for e in found[1]:
                        e.pre(module, args)
            except Exception as e:  # never break the program's forward
                hooks._give_up(e)

        def module_post_hook(module: Any, args: Any, output: Any) -> None:
            if is_compiling():
                if module._compiled_call_impl is not None:
                    outside[1](module, args, output)
                return
            try:
                if type(module).__name__ == "OptimizedModule":
                    module = inner(module)
                found = modules.get(id(module))
                if found is not None and found[0]() is module:
                    for e in reversed(found[1]):
                        e.post(module, args, output)
                observer = hooks.observer
                if observer is not None:
                    observer.post(module, args, output)
            except Exception as e:
                hooks._give_up(e)

        cls._handles = [
            nn_module.register_module_forward_pre_hook(module_pre_hook),
            nn_module.register_module_forward_hook(module_post_hook, always_call=True),
            optim.register_optimizer_step_pre_hook(_step_pre),
            optim.register_optimizer_step_post_hook(_step_post),
        ]
        warnings.filterwarnings("ignore", _COMPILE_WARNING, UserWarning)
        cls._filter = warnings.filters[0]

    @classmethod
    def _uninstall_if_idle(cls) -> None:
        if cls.observer is None and not len(cls.modules) and not len(cls.optimizers):
            cls._uninstall()

    @classmethod
    def _uninstall(cls) -> None:
        for h in cls._handles:
            h.remove()
        cls._handles = []
        if cls._filter in warnings.filters:
            warnings.filters.remove(cls._filter)
            # What filterwarnings itself calls, so that decisions cached under the filter are dropped (private:
            # where it is missing, the warning stays off where it was already ignored).
            getattr(warnings, "_filters_mutated", lambda: None)()
        cls._filter = None

    @classmethod
    def _give_up(cls, error: BaseException) -> None:
        """A failure of allocscope's own inside a hook: the program goes on
        unwatched (its forward or step must never break), with one line."""
        if not cls._failed:
            cls._failed = True
            print(f"allocscope: watching stopped: {type(error).__name__}: {error}", file=sys.stderr)
        cls.observer = None
        cls.modules.clear()
        cls.optimizers.clear()
        cls._uninstall()


def _inner(module: Any) -> Any:
    """The model of a torch.compile wrapper (OptimizedModule): its call is
    the model's, for the watches (the model's own runs inside the graph)."""
    inner = module.__dict__.get("_modules", {}).get("_orig_mod")
    return module if inner is None else inner


# Every module call of the process comes through the hooks while anything
# is watched: one dict lookup for a module no watch has (a few thousand
# instructions, in Module._call_impl's slow path of about 17 thousand more;
# benchmarks/bench_module_call_instructions.py). Inside a compiled region,
# _pre and _post are what a model compiled in place runs outside the graph.
_modules = GlobalHooks.modules._items


def _pre(module: Any, args: Any) -> None:
    try:
        if type(module).__name__ == "OptimizedModule":
            module = _inner(module)
        observer = GlobalHooks.observer
        if observer is not None:
            observer.pre(module, args)
        found = _modules.get(id(module))
        if found is not None and found[0]() is module:
            for e in found[1]:
                e.pre(module, args)
    except Exception as e:  # never break the program's forward
        GlobalHooks._give_up(e)


def _post(module: Any, args: Any, output: Any) -> None:
    try:
        if type(module).__name__ == "OptimizedModule":
            module = _inner(module)
        found = _modules.get(id(module))
        if found is not None and found[0]() is module:
            for e in reversed(found[1]):
                e.post(module, args, output)
        observer = GlobalHooks.observer
        if observer is not None:
            observer.post(module, args, output)
    except Exception as e:
        GlobalHooks._give_up(e)


def _step_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    try:
        observer = GlobalHooks.observer
        if observer is not None:
            observer.step(optimizer)
        entries = GlobalHooks.optimizers.get(optimizer)
        if entries is not None:
            for e in entries:
                e.pre(optimizer, args, kwargs)
    except Exception as e:  # never break the program's step
        GlobalHooks._give_up(e)


def _step_post(optimizer: Any, args: Any, kwargs: Any) -> None:
    try:
        entries = GlobalHooks.optimizers.get(optimizer)
        if entries is not None:
            for e in entries:
                e.post(optimizer, args, kwargs)
    except Exception as e:
        GlobalHooks._give_up(e)
