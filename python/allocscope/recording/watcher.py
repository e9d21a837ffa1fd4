"""Watching a model: annotations that give recorded allocations a meaning.

    with allocscope.record("step.alsc") as rec:
        rec.watch(model, optimizer)
        train()

Watching writes annotation events (docs/format.md, kinds 17-26) into the
recording's ordered stream: module scopes (forward and backward), phases and
the iteration counter, and labels naming tensors by their storage's address
(parameters, buffers, gradients, optimizer state, tensors autograd saves,
inputs). The analysis (allocscope.attribution.categories) joins the labels to the
allocations live at that address at that moment.

It only observes, and leaves nothing on the program's objects: no hook in
a module's or an optimizer's hook dicts, no attribute, no reference that
keeps them alive (global_hooks.py: the process's global hooks look each
module and optimizer up by identity, weakly). A watched model pickles,
deep-copies and saves as an unwatched one, and one the program drops is
freed as it would be unwatched; the watch then writes that its model is
gone (a WATCH update), so that the estimate of a later moment leaves it
out, and ends. The hooks return nothing (so outputs and gradients are
untouched). The one other global change is a thin wrapper around
torch.autograd.backward (which Tensor.backward calls) and
torch.autograd.grad, so that the backward phase starts before the loss's
own backward kernels allocate; they are restored when the last watch ends.

Gradients: where the recording records ops, the recorder labels them itself
as each parameter's AccumulateGrad node ends (csrc/recorder/gradients.h);
otherwise a post-accumulate-grad hook on each parameter does.

Backward module scopes: the recorder writes them itself, no Python runs per
node: where the recording records ops (by default from its first watch()
on), as autograd nodes run (csrc/recorder/ops.h: each node knows the module
whose forward made it); otherwise from the node each allocation is made in
(csrc/recorder/backward_scopes.h), the same scopes for every allocation.
"""

from __future__ import annotations

import itertools
import json
import threading
import weakref
from typing import Any, Callable

from ..capture.format import MODULE_LEAF, EventKind
from ..common.native import native
from .generation import GenerateWatch, running_generation
from .global_hooks import GlobalHooks
from .module_scopes import new_output_bytes as _new_output_bytes
from .module_scopes import storage as _storage
from .module_scopes import tensors as _tensors
from .phases import Phases
from .watch_summary import check_optimizer, model_summary, optimizer_summary

__all__ = ["Watch"]

# Plain ints for the hooks' hot path (IntEnum members convert on every call)
_ENTER = int(EventKind.MODULE_ENTER)
_EXIT = int(EventKind.MODULE_EXIT)
# Each watch's id in its WATCH events, unique in the process: two models
# watched under one name (a model rebuilt after an out-of-memory error) are
# two watches, each with its own life.
_ids = itertools.count(1)


class Watch:
    """Hooks on one model (and optionally its optimizer) that annotate the
    active recording. Made by Recording.watch() or allocscope.watch(); removed
    by remove() or when the recording stops."""

    # False: gradients are labelled by Python hooks even where ops are
    # recorded (the reference the native labels are tested and timed against).
    native_gradients = True
    # False: the modules' scopes (the root's aside) are written by Python
    # functions, not by the C functions of csrc/recorder/module_hooks.h:
    # the reference those are tested against.
    native_module_hooks = True
    # False: autograd calls the saved-tensor hook through Python, as before
    # allocscope's engine answered for it (csrc/recorder/saved_engine.h): the
    # reference that route is tested and timed against.
    saved_hooks_in_cpp = True

    def __init__(self, model: Any, optimizer: Any = None, *, name: str | None = None,
                 device_types: tuple[str, ...] = ("cpu", "cuda"), on_gone: Callable[[Any], None] | None = None):
        """device_types: the devices the recording records; tensors elsewhere
        (Adam's step counters on the host while CUDA is recorded) get no label.
        on_gone(watch): called once the model is gone (the recording forgets the watch)."""
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"watch() needs a torch.nn.Module, not {type(model).__name__}")
        if optimizer is not None:
            check_optimizer(optimizer)  # before any hook is registered
        self.name = name or type(model).__name__
        self.id = next(_ids)
        self._annotate = native().annotate  # (kind, label, addr, size, with_stack); False when not recording
        self._native_scopes = False  # (set once every hook is in: remove() undoes it)
        self._handles: list[Any] = []
        self._local = threading.local()  # per thread: the forward module stack, the saved-tensor hooks
        self._param_moves = native().Changes()  # (csrc/recorder/fingerprints.h)
        self._param_places: list[tuple[weakref.ref[Any], str]] = []
        self._param_storages: set[int] = set()
        self._state_seen: dict[tuple[int, str], int] = {}
        self._state_changes: dict[int, Any] = {}  # id(optimizer) -> the Changes of its state's tensor ids
        self._removed = False
        self._shapes_said = False
        self._on_gone = on_gone
        self._device_types = frozenset(device_types)
        # The saved-tensor hook (csrc/recorder/saved.h): each storage autograd
        # saves is labelled once per forward, as the innermost open module's.
        self._saved = native().SavedTensorLabeler("cuda" in self._device_types, "cpu" in self._device_types,
                                                  self.name, [torch.Tensor, torch.nn.Parameter],
                                                  self.saved_hooks_in_cpp)

        self._param_names = {id(p): self._qualify(fqn) for fqn, p in model.named_parameters()}
        self._model_params = frozenset(self._param_names)
        # Held weakly: the model is the program's. Its end ends the watch
        # (a weak reference's callback, which holds the watch weakly too).
        me = weakref.ref(self)
        self._model = weakref.ref(model, lambda _: _call(me, "_model_gone"))
        self._optimizers: list[weakref.ref[Any]] = []
        # Every module's scopes (global_hooks.py); the root's also begin
        # and end the forward.
        for fqn, m in model.named_modules():
            leaf = next(iter(m.children()), None) is None
            if m is model:
                pre, post = self._root_hooks(self._qualify(fqn), leaf)
            else:
                pre, post = self._module_hooks(self._qualify(fqn), leaf)
            GlobalHooks.add_module(m, self, pre, post)
        trainable = [p for p in model.parameters() if p.requires_grad]
        self._gradients: Any = None
        if self.native_gradients:
            # The recorder labels gradients (csrc/recorder/gradients.h): as
            # AccumulateGrad nodes end, where the op callback runs; else from
            # a post-accumulate-grad hook that is a call into C++. No Python
            # function per parameter either way.
            self._watch_gradients([(p, self._param_names[id(p)]) for p in trainable])
            if not native().ops_active():
                self._handles.extend(p.register_post_accumulate_grad_hook(native().label_gradient)
                                     for p in trainable)
        else:
            for p in trainable:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(self._param_names[id(p)])))
        if optimizer is not None:
            self._attach(optimizer)
        # The recorder writes backward scopes itself: from the op callback
        # when it records ops, else from each event's autograd node.
        if not native().ops_active():
            native().enable_backward_scopes()
            self._native_scopes = True
        Phases.add(self)

        self._emit(EventKind.WATCH, json.dumps({"id": self.id, **model_summary(model, self._qualify), "optimizer": (
            None if optimizer is None else optimizer_summary(optimizer))}, sort_keys=True))
        self._label_parameters(model, force=True)
        self._handles.append(GenerateWatch(model, self._generating))
        under_way = running_generation(model)
        if under_way is not None:
            self._generating(under_way)

    # ---- public

    @property
    def model(self) -> Any:
        """The watched model (None once it is gone)."""
        return self._model()

    def add_optimizer(self, optimizer: Any) -> None:
        """Watches an optimizer of this model made (or found) after the
        watch: its state is labelled and its steps are the optimizer phase
        from its next step (or from this one, when called from a step
        pre-hook)."""
        check_optimizer(optimizer)
        if self._removed or any(r() is optimizer for r in self._optimizers):
            return
        self._attach(optimizer)
        self._update({"optimizer": optimizer_summary(optimizer)})

    def owns_any(self, parameter_ids: set[int]) -> bool:
        """Whether any of these parameters (by id) is one of the model's."""
        return not self._model_params.isdisjoint(parameter_ids)

    def remove(self) -> None:
        """Removes every hook; the model behaves as if never watched."""
        if self._removed:
            return
        self._removed = True
        GlobalHooks.remove_owner(self)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._gradients is not None:
            self._gradients.remove()
            self._gradients = None
        self._saved.close()  # (the engine route: csrc/recorder/saved_engine.h)
        if self._native_scopes:
            native().disable_backward_scopes()
        Phases.discard(self)

    @property
    def iteration(self) -> int:
        """Optimizer steps completed since watching began (by any watched optimizer)."""
        return Phases.iteration

    def __repr__(self) -> str:
        return f"<allocscope.Watch {self.name} iteration={Phases.iteration}{' removed' if self._removed else ''}>"

    # ---- emitting

    def _emit(self, kind: int, label: str, addr: int = 0, size: int = 0) -> None:
        if not self._removed:
            self._annotate(int(kind), label, addr, size, False)

    def _update(self, fields: dict[str, Any]) -> None:
        """A WATCH update: what became known of the watch (docs/format.md)."""
        self._emit(EventKind.WATCH, json.dumps({"id": self.id, "name": self.name, "update": True, **fields},
                                               sort_keys=True))

    def _generating(self, request: dict[str, int]) -> None:
        """A generate() call began (generation.py): what it asks, as an update of the watch."""
        self._update({"generate": request})

    def _model_gone(self) -> None:
        """The model was freed: the estimate of any later moment leaves it
        out, and the watch ends."""
        if self._removed:
            return
        self._update({"gone": True})
        self.remove()
        if self._on_gone is not None:
            self._on_gone(self)

    def _optimizer_gone(self) -> None:
        """An optimizer of the watch was freed (with its state)."""
        if self._removed:
            return
        live = [r() for r in self._optimizers]
        self._optimizers = [r for r, o in zip(self._optimizers, live, strict=True) if o is not None]
        latest = next((o for o in reversed(live) if o is not None), None)
        self._update({"optimizer": None if latest is None else optimizer_summary(latest)})

    def _recorded_storage(self, t: Any) -> tuple[int, int] | None:
        """(data pointer, bytes) of a tensor's storage if it lives on a
        recorded device and holds bytes, else None."""
        if t.device.type not in self._device_types:
            return None
        s = _storage(t)
        return s if s is not None and s[1] > 0 else None

    def _qualify(self, fqn: str) -> str:
        return f"{self.name}.{fqn}" if fqn else self.name

    def _attach(self, optimizer: Any) -> None:
        me = weakref.ref(self)
        self._optimizers.append(weakref.ref(optimizer, lambda _: _call(me, "_optimizer_gone")))
        GlobalHooks.add_optimizer(optimizer, self, self._optimizer_pre, self._optimizer_post)
        for group in optimizer.param_groups:
            for i, p in enumerate(group["params"]):
                self._param_names.setdefault(id(p), f"{self.name}.<optimizer param {i}>")

    # ---- labels

    def _label_parameters(self, model: Any, force: bool = False) -> None:
        # Each forward checks whether the parameters moved (model.to(...)):
        # a walk over the module tree costs more than the data pointers, so
        # where each parameter lives is kept from the last walk: its module
        # (held weakly: a model deleted while watched is freed as unwatched)
        # and its name there. Not the parameter itself: swap_tensors (a
        # load_state_dict that swaps) refuses a tensor with a weak reference.
        if not self._param_moves.addresses(self._param_places) and not force:
            return
        params = list(model.named_parameters())
        self._param_places = _parameter_places(model)
        self._param_moves.addresses(self._param_places)
        if self._gradients is not None and not force:  # (the recorder knows parameters by their TensorImpl)
            self._watch_gradients([(p, self._qualify(fqn)) for fqn, p in params if p.requires_grad])
        labelled: set[int] = set()  # shared storage (tied weights) is named once
        for fqn, p in params:
            s = self._recorded_storage(p)
            if s is not None and s[0] not in labelled:
                labelled.add(s[0])
                self._emit(EventKind.PARAMETER, self._qualify(fqn), *s)
        self._param_storages = set(labelled)
        self._saved.set_parameters(list(labelled))  # (parameters stay parameters)
        for fqn, b in model.named_buffers():
            s = self._recorded_storage(b)
            if s is not None and s[0] not in labelled:
                labelled.add(s[0])
                self._emit(EventKind.BUFFER, self._qualify(fqn), *s)

    def _watch_gradients(self, named: list[tuple[Any, str]]) -> None:
        """The recorder's table of these parameters, for their gradients'
        labels (csrc/recorder/gradients.h), in place of the last one: it
        holds no reference to them (swap_tensors refuses a tensor with
        one), so after they moved or were replaced it is made anew."""
        if self._gradients is not None:
            self._gradients.remove()
        self._gradients = native().GradientWatch(named, "cuda" in self._device_types, "cpu" in self._device_types)

    def _grad_hook(self, name: str) -> Callable[[Any], None]:
        def hook(p: Any) -> None:
            g = p.grad
            s = self._recorded_storage(g) if g is not None else None
            if s is not None:
                self._emit(EventKind.GRADIENT, name, *s)

        return hook

    # ---- module hooks

    def _module_hooks(self, name: str, leaf: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """What a module's call (not the root's) runs before and after its
        forward: the C functions of csrc/recorder/module_hooks.h, or their
        Python reference."""
        if self.native_module_hooks:
            enter, leave = native().module_hooks(name, leaf, _new_output_bytes)
            return enter, leave
        flags = MODULE_LEAF if leaf else 0
        annotate = self._annotate

        def enter_module(module: Any, args: Any) -> None:
            annotate(_ENTER, name, flags, 0, False)

        def leave_module(module: Any, args: Any, output: Any) -> None:
            annotate(_EXIT, name, flags, _new_output_bytes(args, output) if leaf else 0, False)

        return enter_module, leave_module

    def _root_hooks(self, name: str, leaf: bool) -> tuple[Callable[..., None], Callable[..., None]]:
        """What the root's call runs before and after its forward: its scope,
        and the forward phase (begun by the outermost call on a thread)."""
        flags = MODULE_LEAF if leaf else 0
        annotate = self._annotate

        def pre(module: Any, args: Any) -> None:
            local = self._local
            stack = getattr(local, "modules", None)  # (the root's calls open on this thread)
            if stack is None:
                stack = local.modules = []
            if not stack and not Phases.in_backward:  # (not a checkpoint's recompute)
                self._begin_forward(module, args)
            stack.append(name)
            annotate(_ENTER, name, flags, 0, False)

        def post(module: Any, args: Any, output: Any) -> None:
            stack = getattr(self._local, "modules", None)
            if stack and stack[-1] == name:
                stack.pop()
            produced = _new_output_bytes(args, output) if leaf else 0
            annotate(_EXIT, name, flags, produced, False)
            if not stack and getattr(self._local, "saved_hooks", None) is not None:
                self._end_forward()

        return pre, post

    def _begin_forward(self, model: Any, args: Any) -> None:
        first = Phases.phase != "forward"
        Phases.set_phase("forward")
        self._label_parameters(model)
        self._saved.begin_forward()
        # The step's inputs are those of the first watched forward; a watched
        # loss module's inputs (the model's outputs) are not.
        inputs = list(_tensors(args)) if first else []
        for path, t in inputs:
            s = self._recorded_storage(t)
            if s is not None:
                self._emit(EventKind.INPUT, f"{self.name}.input{path}", *s)
        if inputs and not self._shapes_said:  # (once: the batch's dimension, for what would fit)
            self._shapes_said = True
            self._emit(EventKind.WATCH, json.dumps({"name": self.name, "update": True, "input_shapes": {
                path: list(t.shape) for path, t in inputs}}, sort_keys=True))
        import torch.autograd.graph

        saved = self._saved
        # (the native labeler's hooks are C functions: no pybind11 dispatch per saved tensor)
        pack, unpack = ((saved.pack_hook, saved.unpack_hook) if hasattr(saved, "pack_hook")
                        else (saved.pack, saved.unpack))
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        try:
            hooks.__enter__()
        except RuntimeError:  # saved-tensor hooks are disabled here (e.g. under some wrappers)
            hooks = None
        self._local.saved_hooks = hooks

    def _end_forward(self) -> None:
        hooks = getattr(self._local, "saved_hooks", None)
        self._local.saved_hooks = None
        if hooks is not None:
            hooks.__exit__(None, None, None)

    # ---- the optimizer phase

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        Phases.set_phase("optimizer")

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._label_optimizer_state(optimizer)
        Phases.iteration += 1
        Phases.set_phase("other", force=True)  # the counter moved even if the phase did not

    def _label_optimizer_state(self, optimizer: Any) -> None:
        import torch

        # Optimizers make their state at the first step and update it in
        # place: the same tensor objects as after the last step mean nothing
        # to label (a look at each tensor's storage costs ~3 us, the ids ~0.1).
        # New objects (lazily made state, load_state_dict) are looked at.
        # Were a tensor replaced unseen, its memory would still be
        # optimizer_state by the phase rule, without its parameter's name.
        changes = self._state_changes.get(id(optimizer))
        if changes is None:
            changes = self._state_changes[id(optimizer)] = native().Changes()
        if not changes.values(optimizer.state):
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                state = optimizer.state.get(p)
                if not state:
                    continue
                pname = self._param_names.get(id(p), f"{self.name}.<param>")
                for key, value in state.items():
                    if not isinstance(value, torch.Tensor):
                        continue
                    s = self._recorded_storage(value)
                    if s is None or self._state_seen.get((id(p), key)) == s[0]:
                        continue
                    self._state_seen[(id(p), key)] = s[0]
                    self._emit(EventKind.OPTIMIZER_STATE, f"{pname}/{key}", *s)


def _call(ref: "weakref.ref[Watch]", method: str) -> None:
    """A weak reference's callback: the watch's method, if the watch lives."""
    w = ref()
    if w is not None:
        getattr(w, method)()


def _parameter_places(model: Any) -> list[tuple["weakref.ref[Any]", str]]:
    """(its module, held weakly, and its name there) of each of the model's
    parameters, once each, in named_parameters()' order."""
    seen: set[int] = set()
    out = []
    for _, module in model.named_modules():
        for name, p in module._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                out.append((weakref.ref(module), name))
    return out
