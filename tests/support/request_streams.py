"""Request streams for differential testing of the allocator model against
torch's real caching allocator (c10), on the virtual GPU or a GPU.

A program is a list of operations (JSON lists, so that it travels to a
worker process and into a failure message as it is):

    ["alloc", nbytes, stream]   a tensor of nbytes on stream 0 (the current
                                stream) or a side stream 1..SIDE_STREAMS; an
                                allocation that runs out of memory is caught
    ["free", k]                 drops live tensor k % (number live)
    ["use", k, stream]          record_stream(live tensor k % n, stream): its
                                free then waits for an event on that stream
    ["empty_cache"]             torch.cuda.empty_cache()
    ["sync"]                    torch.cuda.synchronize()
    ["fraction", nbytes]        set_per_process_memory_fraction(nbytes / total), total
                                the device's (or the Worker's fraction_of:
                                the same fractions on a smaller card)
    ["graph", [ops]]            the ops captured into a CUDA graph (its
                                allocations go to the graph's private pool);
                                tensors still alive at its end stay live
    ["drop_graph", k]           deletes graph k % (number kept): its pool is
                                released once no tensor of it is left

Operations refer to live tensors by position, not by name, so that any
sublist of a program is a program: hypothesis shrinks a failing one to a few
operations.

A Worker is a process on a CUDA device (the virtual GPU this process runs on,
or one named) with one PYTORCH_CUDA_ALLOC_CONF, that runs programs one after
another, each recorded into its own capture; check() replays a capture and
lists every way the model differed from the recording.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from .environment import with_alloc_conf

__all__ = ["SETTINGS", "SIDE_STREAMS", "TORCH_ABORTS", "TorchAborted", "Worker", "check", "programs", "run_program"]

SIDE_STREAMS = 2
MiB = 1 << 20
GiB = 1 << 30

# One per PYTORCH_CUDA_ALLOC_CONF setting the model supports (issue #13);
# garbage collection runs only under a memory fraction, so its programs set one.
SETTINGS: dict[str, str] = {
    "defaults": "",
    "expandable_segments": "expandable_segments:True",
    "max_split_size_mb": "max_split_size_mb:20",
    "roundup_power2_divisions": "roundup_power2_divisions:4",
    "roundup_power2_divisions_table": "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "garbage_collection_threshold": "garbage_collection_threshold:0.6",
    "max_non_split_rounding_mb": "max_split_size_mb:20,max_non_split_rounding_mb:64",
    "release_lock_on_cudamalloc": "release_lock_on_cudamalloc:True",
    "pinned_use_cuda_host_register": "pinned_use_cuda_host_register:True,pinned_num_register_threads:2",
}
NEEDS_FRACTION = {"garbage_collection_threshold"}
# torch's own allocator fails CUDA graphs under expandable segments: releasing
# a graph's private pool whose expandable segment was unmapped in several
# ranges trips c10's `cudaMalloc_count > 0` assertion (or corrupts its heap),
# without allocscope (seen on 2.14.1; reproduced by
# benchmarks/soak_replay.py --torch-bug). Those streams have no graphs.
NO_GRAPHS = {"expandable_segments"}

# Sizes around the allocator's thresholds: the small pool's limit (1 MiB),
# small and large segments (2 and 20 MiB), direct allocation (10 MiB), and
# the settings' split limits (20 and 64 MiB).
BOUNDARIES = (1, 511, 512, 513, MiB - 1, MiB, MiB + 1, 2 * MiB, 10 * MiB - 1, 10 * MiB, 10 * MiB + 1, 20 * MiB,
              20 * MiB + 1, 64 * MiB, 84 * MiB)


# ---- generating programs (hypothesis, imported only where programs are made)

def programs(setting: str = "defaults", *, min_ops: int = 10, max_ops: int = 80, graphs: bool = True) -> Any:
    """A hypothesis strategy of programs for one setting."""
    from hypothesis import strategies as st

    log_size = st.integers(0, 31).flatmap(lambda e: st.integers(1 << e, (2 << e) - 1))
    size = st.one_of(log_size, st.sampled_from(BOUNDARIES))
    stream = st.integers(0, SIDE_STREAMS)
    pick = st.integers(0, 1 << 16)
    # The fraction's limit: from a few segments to a few GiB.
    limit = st.integers(0, 12).map(lambda e: (64 * MiB) << (e // 2) if e % 2 == 0 else 96 * MiB << (e // 2))

    @st.composite
    def program(draw: Any) -> list[Any]:
        palette = draw(st.lists(size, min_size=1, max_size=6))
        alloc_size = st.one_of(st.sampled_from(palette), size)
        alloc = st.tuples(st.just("alloc"), alloc_size, stream)
        simple = st.one_of(
            alloc, alloc, alloc, alloc,
            st.tuples(st.just("free"), pick), st.tuples(st.just("free"), pick), st.tuples(st.just("free"), pick),
            st.tuples(st.just("use"), pick, st.integers(1, SIDE_STREAMS)),
            st.just(("empty_cache",)), st.just(("sync",)), st.tuples(st.just("drop_graph"), pick),
            st.tuples(st.just("fraction"), limit))
        graph = st.tuples(st.just("graph"), st.lists(st.one_of(st.tuples(st.just("alloc"), alloc_size, st.just(0)),
                                                                st.tuples(st.just("free"), pick)),
                                                      min_size=1, max_size=6).map(lambda ops: [list(o) for o in ops]))
        op = st.one_of(simple, graph) if graphs and setting not in NO_GRAPHS else simple
        ops = [list(o) for o in draw(st.lists(op, min_size=min_ops, max_size=max_ops))]
        if setting in NEEDS_FRACTION:
            ops.insert(0, ["fraction", draw(limit)])
        return ops

    return program()


# ---- running programs (in the worker)

class _Runner:
    """Runs programs in this process, on CUDA device 0, each recorded."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        torch.cuda.init()
        self.total = torch.cuda.get_device_properties(0).total_memory
        self.fraction_of = self.total
        self.streams = [torch.cuda.current_stream()] + [torch.cuda.Stream() for _ in range(SIDE_STREAMS)]

    def run(self, program: list[Any], path: str, fraction_of: int | None = None) -> dict[str, Any]:
        import allocscope

        self.fraction_of = fraction_of or self.total

        torch = self.torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        # c10 cannot unset a fraction: at 1.0 it only matters to garbage
        # collection, whose programs set their own fraction first.
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.reset_peak_memory_stats()
        live: list[Any] = []
        graphs: list[Any] = []
        ooms: list[int] = []
        with allocscope.record(path, device="cuda", stacks="none"):
            for j, op in enumerate(program):
                self._op(op, j, live, graphs, ooms)
            torch.cuda.synchronize()
        out = {"max_reserved": int(torch.cuda.max_memory_reserved()), "reserved": int(torch.cuda.memory_reserved()),
               "ooms": ooms, "live": len(live)}
        del live[:]
        torch.cuda.synchronize()
        # One graph at a time, so that c10's map of freeable pools never
        # holds more than one from this clean-up (its size orders releases).
        while graphs:
            del graphs[-1]
            torch.cuda.empty_cache()
        torch.cuda.empty_cache()
        out["left"] = int(torch.cuda.memory_reserved())  # what the next program starts with
        return out

    def _op(self, op: list[Any], j: int, live: list[Any], graphs: list[Any], ooms: list[int]) -> None:
        torch = self.torch
        what = op[0]
        if what == "alloc":
            try:
                with torch.cuda.stream(self.streams[op[2]]):
                    live.append(torch.empty(op[1], dtype=torch.uint8, device="cuda"))
            except torch.cuda.OutOfMemoryError:
                ooms.append(j)
        elif what == "free":
            if live:
                del live[op[1] % len(live)]
        elif what == "use":
            if live:
                live[op[1] % len(live)].record_stream(self.streams[op[2]])
        elif what == "empty_cache":
            torch.cuda.empty_cache()
        elif what == "sync":
            torch.cuda.synchronize()
        elif what == "fraction":
            torch.cuda.set_per_process_memory_fraction(min(1.0, op[1] / self.fraction_of))
        elif what == "graph":
            self._graph(op[1], j, live, graphs, ooms)
        elif what == "drop_graph":
            if graphs:
                del graphs[op[1] % len(graphs)]
        else:
            raise ValueError(f"unknown operation {op!r}")

    def _graph(self, ops: list[Any], j: int, live: list[Any], graphs: list[Any], ooms: list[int]) -> None:
        torch = self.torch
        g = torch.cuda.CUDAGraph()
        inside: list[Any] = []
        try:
            with torch.cuda.graph(g):
                for op in ops:
                    if op[0] == "alloc":
                        inside.append(torch.empty(op[1], dtype=torch.uint8, device="cuda"))
                    elif inside:
                        del inside[op[1] % len(inside)]
        except torch.cuda.OutOfMemoryError:
            ooms.append(j)
            return
        graphs.append(g)
        live.extend(inside)  # tensors still alive at the capture's end stay live in the program


def _serve() -> None:
    """The worker's loop: one JSON request per line on stdin, one JSON answer
    per line on the original stdout (anything else printed goes to stderr)."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    runner = _Runner()
    answers.write(json.dumps({"ready": True, "total": runner.total,
                              "torch": runner.torch.__version__}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        try:
            answer = runner.run(req["program"], req["path"], req.get("fraction_of"))
        except Exception as e:  # the harness reports it with the program
            answer = {"error": f"{type(e).__name__}: {e}"}
        answers.write(json.dumps(answer) + "\n")


# Aborts of torch's own making, seen on the virtual GPU (docs/allocator.md,
# Limits): torch 2.11's ~CUDAGraph throws in unregister_graph now and then,
# about once in 140 generated streams with graphs, and not again when the
# same stream runs in a fresh process.
TORCH_ABORTS = ("The graph should be registered to the state",)


class TorchAborted(RuntimeError):
    """The worker died of one of TORCH_ABORTS."""


class Worker:
    """A process that runs programs on CUDA with one allocator setting.

    env: the process environment (default: this one's, which carries the
    virtual GPU where this process runs on it)."""

    def __init__(self, conf: str, *, env: dict[str, str] | None = None, directory: str | None = None,
                 fraction_of: int | None = None):
        self.conf = conf
        self.fraction_of = fraction_of  # programs' fractions are of this many bytes (None: the device's)
        base = with_alloc_conf(conf, env)
        self._root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        base["PYTHONPATH"] = os.pathsep.join(p for p in (self._root, base.get("PYTHONPATH", "")) if p)
        self._env = base
        self._dir = tempfile.TemporaryDirectory(prefix="allocscope-streams-", dir=directory)
        self._log = open(os.path.join(self._dir.name, "worker.log"), "w+")
        self.runs = 0
        self.aborts: list[str] = []  # TORCH_ABORTS met (run_program ran the stream again)
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.request_streams"], cwd=self._root,
                                     env=self._env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, bufsize=1)
        hello = self._answer()
        self.total, self.torch = int(hello["total"]), str(hello["torch"])

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self._died()
        return json.loads(line)

    def _died(self) -> None:
        self._log.seek(0)
        log = self._log.read()
        if any(bug in log for bug in TORCH_ABORTS):
            raise TorchAborted(f"torch aborted the stream worker ({self.conf or 'defaults'}): "
                               + next(b for b in TORCH_ABORTS if b in log))
        raise RuntimeError(f"the stream worker ({self.conf or 'defaults'}) died:\n{log[-3000:]}")

    def run(self, program: list[Any]) -> tuple[str, dict[str, Any]]:
        """Runs a program; returns its capture's path and what torch measured."""
        assert self.proc.stdin is not None
        self.runs += 1
        path = os.path.join(self._dir.name, f"run{self.runs % 4}.alsc")
        try:
            self.proc.stdin.write(json.dumps({"program": program, "path": path,
                                              "fraction_of": self.fraction_of}) + "\n")
        except BrokenPipeError:
            self._died()
        answer = self._answer()
        if "error" in answer:
            raise RuntimeError(f"the program failed in the worker: {answer['error']}")
        return path, answer

    def restart(self) -> None:
        """A fresh process: c10 state that no capture records is reset."""
        self._stop()
        self._log.seek(0)
        self._log.truncate()
        self._start()

    def _end_input(self) -> None:
        """Tells the worker to end (its loop reads requests until stdin closes)."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.close()

    def _stop(self) -> None:
        if self.proc.poll() is None:
            self._end_input()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def close(self) -> None:
        self._stop()
        self._log.close()
        self._dir.cleanup()

    @staticmethod
    def close_all(workers: "list[Worker]") -> None:
        """Closes several: every process is told to end before any is waited
        for, so their exits (torch's teardown, about a second each) overlap."""
        for w in workers:
            w._end_input()
        for w in workers:
            w.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---- checking a capture against its replay

def check(path: str, measured: dict[str, Any]) -> tuple[list[str], Any, int]:
    """Every difference between the recording and its replay with the
    recorded settings (segment events, block addresses, the end snapshot,
    the peak reserved and the requests that ran out of memory), the replay,
    and the number of events checked."""
    import allocscope
    from allocscope.allocator.replay import replay

    cap = allocscope.load(path)
    rep = replay(cap)
    f = rep.fidelity
    assert f is not None
    problems = []
    if f.first_mismatch is not None or f.matched != f.recorded_segment_events:
        problems.append(f"segment events: {f.matched} of {f.recorded_segment_events} matched; "
                        f"first mismatch {f.first_mismatch}")
    if f.address_mismatches:
        problems.append(f"{f.address_mismatches} of {f.allocations} blocks at another address")
    if f.end_snapshot is not None and not f.end_snapshot["equal"]:
        problems.append(f"end snapshot differs: {f.end_snapshot}")
    if rep.peak_reserved != measured["max_reserved"]:
        problems.append(f"peak reserved {rep.peak_reserved} replayed, {measured['max_reserved']} measured")
    failed = sum(1 for o in rep.ooms if o.recorded)
    if failed != len(measured["ooms"]) or rep.avoided_ooms:
        problems.append(f"{failed} OOMs replayed ({len(rep.avoided_ooms)} avoided), "
                        f"{len(measured['ooms'])} measured")
    return problems, rep, len(cap.events)


def run_program(worker: Worker, program: list[Any], *, fresh_pool_map: bool = True) -> tuple[list[str], int]:
    """Runs and checks one program: (differences, events in its capture).

    c10 orders the release of several freeable CUDA-graph pools by a hash
    map that grows and never shrinks; a capture cannot show its size before
    the recording started, and the replay learns it from the recorded order
    of segment frees (docs/allocator.md). After a program that grew it, the
    worker starts afresh so that every stream starts from a known map,
    unless fresh_pool_map is False (soak_replay.py --keep-pool-map holds the
    learning to c10 that way)."""
    try:
        path, measured = worker.run(program)
    except TorchAborted as e:
        # Once, in a fresh process; a second abort fails the stream.
        worker.aborts.append(str(e))
        worker.restart()
        path, measured = worker.run(program)
    problems, rep, events = check(path, measured)
    # (a natively replayed capture had no private pools: its devices have no map)
    if fresh_pool_map and any(getattr(dev, "freeable", None) is not None and dev.freeable.buckets > 4
                              for dev in rep.devices.values()):
        worker.restart()
    return problems, events


if __name__ == "__main__":
    _serve()
