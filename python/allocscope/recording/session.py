"""Recording: allocscope.record(...) and allocscope.mark(...).

    with allocscope.record("step.alsc"):
        train_one_step()

One recording at a time per process. It writes a capture file while it runs
(streamed through a bounded buffer), and a footer when it stops; a process
that dies mid-recording leaves a readable prefix.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import Any

from ..capture.format import EventKind
from ..common.errors import InputError
from ..common.native import native
from .exits import EXIT, at_process_exit

__all__ = ["AllocscopeError", "Recording", "mark", "record", "watch"]

STACK_MODES = ("python", "none")
# Events between checkpoints (docs/format.md, CHECKPOINT): a report of a late
# step reads about this many events after the nearest one, and the file
# grows by the live set and a baseline per checkpoint.
CHECKPOINT_EVERY = 500_000


class AllocscopeError(InputError, RuntimeError):
    """A recording cannot start as asked (the message says why, in one line)."""


# Reentrant: a signal handler that calls os._exit (or raises SystemExit) can
# run in the middle of stop() on the same thread, and the exit then stops
# the recording itself (exits.py) instead of waiting on itself forever.
_lock = threading.RLock()
_active: "Recording | None" = None
_checkpoint_lock = threading.Lock()
_fork_hook_registered = False


def _device_type(device: Any) -> str | None:
    """'cpu', 'cuda', or None (decide when starting); accepts torch.device too."""
    if device is None:
        return None
    text = str(device)
    if text == "cpu":
        return "cpu"
    if text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        return "cuda"
    raise InputError(f"device must be 'cpu', 'cuda' or None (CUDA if available), not {device!r}")


def _resolve_devices(device: Any) -> tuple[str, ...]:
    kind = _device_type(device)
    if kind is None:
        import torch

        kind = "cuda" if torch.cuda.is_available() else "cpu"
    return (kind,)


def _sigterm_not_pythons() -> bool:
    """Whether SIGTERM has no Python handler: its default action, or a
    handler installed outside Python's signal module (faulthandler's), which
    Python reports as SIG_DFL (or None, one from before Python started).
    Then the recorder finishes the capture on SIGTERM and raises it again;
    a Python handler is the program's to act on (recorder.cpp)."""
    import signal

    try:
        return signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)
    except (ValueError, AttributeError):  # (no SIGTERM here)
        return False


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Recording:
    """A recording of one process's allocations into one capture file.

    Usually made by allocscope.record(); start() and stop() are for code that
    cannot use a with-block.
    """

    def __init__(self, path: str | os.PathLike[str], *, device: Any = None, stacks: str = "python",
                 ops: bool | None = None, checkpoint_every: int = CHECKPOINT_EVERY, _check_cuda: bool = True,
                 _remove_if_unused: bool = False):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
            raise InputError(f"checkpoint_every must be a number of events >= 0 (0: none), not {checkpoint_every!r}")
        if stacks not in STACK_MODES:
            raise InputError(f"stacks must be one of {', '.join(map(repr, STACK_MODES))}, not {stacks!r}")
        _device_type(device)
        self.path = os.path.abspath(os.fspath(path))
        self.stacks = stacks
        if ops is not None and not isinstance(ops, bool):
            raise InputError(f"ops must be True, False or None (from the first watch on), not {ops!r}")
        self.ops = ops
        self.checkpoint_every = checkpoint_every
        self._next_checkpoint = checkpoint_every  # the event count at which the next one is due
        self._device = device
        self._check_cuda = _check_cuda  # False only for the no-GPU test harness
        self._remove_if_unused = _remove_if_unused  # a helper process's file (recording/autostart.py)
        self.devices: tuple[str, ...] = ()
        self.summary: dict[str, Any] | None = None
        self._running = False
        self._pid = 0  # the process that started it (a forked child must not stop it)
        self._watches: list[Any] = []
        self._auto: Any = None

    @property
    def active(self) -> bool:
        return self._running

    def start(self) -> "Recording":
        global _active, _fork_hook_registered
        C = native()
        self.devices = _resolve_devices(self._device) if self._check_cuda else ("cuda",)
        if "cuda" in self.devices and self._check_cuda:
            import torch

            if not C.built_with_cuda():
                raise AllocscopeError("allocscope was built without CUDA support; rebuild it against a CUDA build of torch")
            if not torch.cuda.is_available():
                raise AllocscopeError("CUDA is not available in this process; record with device='cpu'")
            torch.cuda.init()  # the wrapper needs the allocator initialized
        with _lock:
            if _active is not None or C.is_active():
                where = _active.path if _active is not None else "another file"
                raise AllocscopeError(f"allocscope is already recording to {where}; one recording at a time")
            metadata = self._metadata()
            try:
                C.start(self.path, json.dumps(metadata), self.stacks == "python", self.ops is True,
                        self.checkpoint_every > 0, _sigterm_not_pythons(), self._remove_if_unused)
            except RuntimeError as e:
                raise AllocscopeError(str(e)) from None
            try:
                if "cpu" in self.devices:
                    C.install_cpu()
                if "cuda" in self.devices:
                    C.install_cuda()
                self._baseline("start")
                if "cuda" in self.devices and self._check_cuda:
                    _watch_settings(self)
            except BaseException as e:
                self._uninstall(C)
                C.stop("failed to start")
                if isinstance(e, RuntimeError):
                    raise AllocscopeError(str(e).splitlines()[0]) from None
                raise
            self._running = True
            self._pid = os.getpid()
            _active = self
            from .phases import Phases

            Phases.before_forward = checkpoint_if_due  # watches ask for checkpoints where iterations start
            at_process_exit(_stop_at_exit)
            if not _fork_hook_registered:
                os.register_at_fork(after_in_child=_forget_in_child)
                _fork_hook_registered = True
        return self

    def stop(self, reason: str = "stopped") -> dict[str, Any]:
        """Stops recording and finishes the file; returns a summary (events, bytes, ...)."""
        global _active
        with _lock:
            if not self._running:
                return self.summary or {}
            if os.getpid() != self._pid:  # a forked child: the parent's recording
                self._running = False
                _active = None
                return {}
            C = native()
            if self._auto is not None:
                self._auto.remove()
                self._auto = None
            for w in list(self._watches):
                w.remove()
            self._watches = []
            baseline_error = None
            try:
                self._baseline("end")
            except Exception as e:  # the file must still be finished, and a
                baseline_error = e  # user's exception must not be masked
            self._uninstall(C)
            self.summary = dict(C.stop(reason))
            self._running = False
            if _active is self:
                _active = None
        if baseline_error is not None:
            print(f"allocscope: {self.path} has no end baseline: {baseline_error}", file=sys.stderr)
        if self.summary.get("error"):
            print(f"allocscope: writing {self.path} failed: {self.summary['error']}; "
                  f"{self.summary['dropped']} events were lost", file=sys.stderr)
        return self.summary

    def mark(self, label: str) -> None:
        """Writes a labelled event (with the caller's stack) into this recording."""
        if self._running:
            self.checkpoint_if_due()
            native().annotate(int(EventKind.MARK), str(label), 0, 0, True)

    def checkpoint_if_due(self) -> None:
        """Asks the writer for a checkpoint (docs/format.md, CHECKPOINT) when
        checkpoint_every events came since the last one. Called where a
        report may want to start reading: before a mark, before each
        forward phase of a watched model. The live set is the writer
        thread's work; here only the allocator's state is taken (on CUDA a
        snapshot, under its lock: the point is the SNAPSHOT event)."""
        if not self._running or not self.checkpoint_every or native().next_seq() < self._next_checkpoint:
            return
        with _checkpoint_lock:  # the writer pairs each baseline with the point armed before it
            self._checkpoint()

    def _checkpoint(self) -> None:
        C = native()
        if C.next_seq() < self._next_checkpoint:  # another thread took it
            return
        cuda = "cuda" in self.devices and self._check_cuda
        if cuda:
            import torch

            if torch.cuda.is_current_stream_capturing():  # no device queries inside a CUDA graph's capture
                return
        at = C.arm_checkpoint(cuda)
        if at >= 1 << 63:  # this recording writes none
            return
        self._next_checkpoint = at + self.checkpoint_every
        base = ""  # "": no checkpoint this time
        try:
            if cuda:
                base = _with_virtual_cards(C.cuda_baseline_json("checkpoint", *self._cuda_devices()))
            else:
                base = json.dumps({"label": "checkpoint", "device_type": "cpu", "seq": at,
                                   "monotonic_ns": time.monotonic_ns(), "rss_bytes": _rss_bytes()})
        except Exception:  # the recording goes on without it
            base = ""
        finally:  # always: the writer holds later checkpoints until this one's baseline comes
            C.checkpoint_baseline(base)

    def watch(self, model: Any, optimizer: Any = None, *, name: str | None = None) -> Any:
        """Annotates this recording with model's module scopes, phases and
        tensor labels (parameters, buffers, gradients, saved activations,
        inputs, and optimizer's state), so that the analysis can say what
        each allocation is. Returns an allocscope.Watch; its hooks are
        removed when the recording stops (or by its remove())."""
        if not self._running:
            raise AllocscopeError("this recording is not running; watch() inside the record() block")
        from .watcher import Watch

        w = self._watch_of(model)
        if w is not None:  # watched already (by auto_watch, say): the optimizer joins that watch
            if optimizer is not None:
                w.add_optimizer(optimizer)
            return w
        if self.ops is None:
            # Watched models' backward scopes and saved activations' stacks come
            # from the op recorder: from here on, ops are recorded.
            native().start_ops()
        w = Watch(model, optimizer, name=name, device_types=self.devices, on_gone=self._forget_watch)
        self._watches.append(w)
        return w

    def _forget_watch(self, watch: Any) -> None:
        """A watch whose model is gone: the recording keeps nothing of it."""
        self._watches = [w for w in self._watches if w is not watch]

    def auto_watch(self) -> None:
        """Watches models without watch() calls: each model when it is first
        called outside any other module, and each optimizer at its first
        step, with the model whose parameters it steps (`allocscope fit` and
        the gpu_memory marker do this). A model watched with watch() stays
        that watch's."""
        if not self._running:
            raise AllocscopeError("this recording is not running; auto_watch() inside the record() block")
        if self._auto is None:
            from .autowatch import AutoWatch

            self._auto = AutoWatch(self.watch, lambda: list(self._watches))

    def _watch_of(self, model: Any) -> Any:
        return next((w for w in self._watches if w.model is model), None)

    def _uninstall(self, C: Any) -> None:
        _unwatch_settings()
        if "cuda" in self.devices and C.built_with_cuda():
            C.uninstall_cuda()
        if "cpu" in self.devices:
            C.uninstall_cpu()

    def _metadata(self) -> dict[str, Any]:
        from .metadata import collect

        if self._check_cuda:
            return collect(list(self.devices), self.stacks, self.ops)
        return collect(["cpu"], self.stacks, self.ops) | {"devices_recorded": ["cuda"], "fake_cuda": True}

    def _cuda_devices(self) -> tuple[list[int], list[int]]:
        """The devices a CUDA baseline describes, and those of them whose
        memory it reads."""
        if not self._check_cuda:
            return [0], [0]
        import torch

        # Memory is read only on devices this process already has a context
        # on: asking another would create a CUDA context (hundreds of MiB)
        # there, as a process that misses torch.cuda.set_device does. With
        # none yet (CUDA initializing: recording started by `allocscope run`)
        # the current device is described without its memory, for a process
        # that initializes CUDA and never allocates (Inductor's compile
        # workers) must not get a context from us. The end baseline reads the
        # devices used by then, and a replay takes what the allocator could
        # have from there (allocator/recorded.py, device_info).
        count = torch.cuda.device_count()
        reserved = [i for i in range(count) if torch.cuda.memory_reserved(i) > 0]
        has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
        if has_context is None:
            devices = sorted({torch.cuda.current_device(), *reserved})
            return devices, devices
        used = sorted({*reserved, *(i for i in range(count) if has_context(i))})
        return used or [torch.cuda.current_device()], used

    def _baseline(self, label: str) -> None:
        C = native()
        if "cuda" in self.devices:
            C.add_baseline(_with_virtual_cards(C.cuda_baseline_json(label, *self._cuda_devices())))
        if "cpu" in self.devices:
            C.add_baseline(json.dumps({"label": label, "device_type": "cpu", "seq": C.next_seq(),
                                       "monotonic_ns": time.monotonic_ns(), "rss_bytes": _rss_bytes()}))

    def __repr__(self) -> str:
        state = "recording" if self._running else "stopped"
        return f"<allocscope.Recording {self.path!r} {'+'.join(self.devices) or '?'} {state}>"


# The function torch's _set_allocator_settings calls (torch 2.11 and 2.14),
# while a CUDA recording runs: (the original, the recording).
_SETTINGS_FUNCTION = "_accelerator_setAllocatorSettings"
_settings_watch: tuple[Any, "Recording"] | None = None


def _watch_settings(rec: "Recording") -> None:
    """Settings changed while recording (torch.cuda.memory._set_allocator_settings)
    change how the allocator rounds and splits from then on, which the
    allocator tells nobody: each change takes a baseline labelled
    "settings" (the new config, at its place among the events), from which
    a replay takes the settings from there on (docs/format.md)."""
    global _settings_watch
    import torch

    original = getattr(torch._C, _SETTINGS_FUNCTION, None)
    if original is None or _settings_watch is not None:
        return

    def set_allocator_settings(env: str) -> Any:
        result = original(env)
        if rec.active:
            rec._baseline("settings")
        return result

    _settings_watch = (original, rec)
    setattr(torch._C, _SETTINGS_FUNCTION, set_allocator_settings)


def _unwatch_settings() -> None:
    global _settings_watch
    if _settings_watch is None:
        return
    import torch

    setattr(torch._C, _SETTINGS_FUNCTION, _settings_watch[0])
    _settings_watch = None


def _with_virtual_cards(baseline: str) -> str:
    """On the virtual GPU, each device's reading gains what the card knows
    of the memory outside the caching allocator: NCCL's own buffers, and
    what other processes of the run hold there (docs/format.md, baselines)."""
    from .. import vgpu

    if not vgpu.active():
        return baseline
    cards = vgpu.state()["devices"]
    doc = json.loads(baseline)
    for d in doc.get("devices") or ():
        card = cards[d["index"]] if 0 <= d.get("index", -1) < len(cards) else None
        if card is not None:
            d["virtual"] = {k: card[k] for k in ("own", "nccl", "nccl_peak", "other_processes", "other_contexts",
                                                "contexts_created", "context_bytes")}
    return json.dumps(doc)


class record(contextlib.ContextDecorator):
    """Records every allocation and free made while the block runs.

    path: the capture file to write (overwritten).
    device: 'cuda', 'cpu', or None for CUDA when available, else the CPU.
    stacks: 'python' records the Python stack of every allocation; 'none' does not.
    ops: record the op behind every allocation (and give allocations in
    backward the Python stack of their forward op). It costs a callback on
    every op, allocating or not, more than the rest of recording where the
    CPU is the bottleneck; None (the default) records them from the first
    watch() on, whose backward module scopes come from them; True from the
    start; False never.
    checkpoint_every: events between checkpoints, from which `report
    --steps` reads a late step of a long run without reading all that
    precedes it (0: none).

    Used as a decorator, each call records anew into the same file.
    """

    def __init__(self, path: str | os.PathLike[str], *, device: Any = None, stacks: str = "python",
                 ops: bool | None = None, checkpoint_every: int = CHECKPOINT_EVERY):
        self._args = (path, device, stacks, ops, checkpoint_every)
        # validate the arguments now
        Recording(path, device=device, stacks=stacks, ops=ops, checkpoint_every=checkpoint_every)
        self._recordings: list[Recording] = []

    def __enter__(self) -> Recording:
        path, device, stacks, ops, every = self._args
        rec = Recording(path, device=device, stacks=stacks, ops=ops, checkpoint_every=every).start()
        self._recordings.append(rec)
        return rec

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        rec = self._recordings.pop()
        rec.stop("stopped" if exc_type is None else f"exception: {exc_type.__name__}")
        return False


def mark(label: str) -> bool:
    """Writes a labelled event into the active recording's stream.

    Returns False (and does nothing) when no recording is active. Cheap enough
    to call every step.
    """
    rec = _active
    if rec is None:
        return False
    rec.checkpoint_if_due()
    return bool(native().annotate(int(EventKind.MARK), str(label), 0, 0, True))


def checkpoint_if_due() -> None:
    """Recording.checkpoint_if_due() on the active recording, if any."""
    rec = _active
    if rec is not None:
        rec.checkpoint_if_due()


def watch(model: Any, optimizer: Any = None, *, name: str | None = None) -> Any:
    """Recording.watch() on the active recording (the one `allocscope run`
    started, for instance). Returns None, and does nothing, when no recording
    is active, so a script can keep the call when run without allocscope."""
    rec = _active
    if rec is None:
        return None
    return rec.watch(model, optimizer, name=name)


def _forget_in_child() -> None:
    # The parent's recording is not the child's: the native side stops
    # recording in the child, and mark() and stop() there do nothing.
    global _active
    if _active is not None:
        _active._running = False
        _active = None


def _stop_at_exit(how: str) -> None:
    rec = _active
    if rec is not None:
        rec.stop("atexit" if how == EXIT else how)
