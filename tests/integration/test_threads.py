"""Many threads allocating and freeing at once while recording: nothing lost,
nothing duplicated, frees always sequenced before reuse, no deadlock.

The workload runs in a child process with a timeout: a deadlock fails the
test instead of hanging the suite."""

import json

import numpy as np

import allocscope
from allocscope import EventKind
from allocscope.attribution.lifetimes import lifetimes

from ..conftest import ROOT, run_python

WORKLOAD = r'''
import json, sys, threading
import torch, allocscope
from tests.native import allocscope_testing  # the test-only harness (run from the repository's root)

path, n_threads, per_thread = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ids = {}
barrier = threading.Barrier(n_threads + 1)

def make_worker(size):
    # A distinct function per thread: each thread meets new stacks at the same
    # time, so the GIL-taking symbolization path runs concurrently too.
    src = f"def worker_{size}():\n    ids[{size}] = threading.get_native_id()\n    barrier.wait()\n" \
          f"    for _ in range({per_thread}):\n        t = torch.empty({size}, dtype=torch.uint8)\n        del t\n"
    scope = {"ids": ids, "barrier": barrier, "threading": threading, "torch": torch}
    exec(compile(src, f"<worker {size}>", "exec"), scope)
    return scope[f"worker_{size}"]

sizes = [1000 + 64 * i for i in range(n_threads)]
with allocscope.record(path, device="cpu"):
    threads = [threading.Thread(target=make_worker(s)) for s in sizes]
    for t in threads:
        t.start()
    barrier.wait()
    # Meanwhile, threads with no Python state at all (like autograd's).
    allocscope_testing.cpu_alloc_from_native_threads(4, per_thread, 777)
    for t in threads:
        t.join()
print(json.dumps({"sizes": sizes, "ids": ids}))
'''


def test_concurrent_threads_lose_and_duplicate_nothing(tmp_path):
    path = tmp_path / "threads.alsc"
    n_threads, per_thread = 8, 5000  # 96k events: the ring (65536) wraps under contention
    result = run_python(WORKLOAD, str(path), str(n_threads), str(per_thread), timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    cap = allocscope.load(path)
    ev = cap.events
    assert cap.complete
    assert ev.seq.tolist() == list(range(len(ev)))  # no gap, no duplicate

    lt = lifetimes(ev)
    assert len(lt.unmatched_frees) == 0 and len(lt.double_allocs) == 0
    assert len(lt.live_at_end) == 0

    alloc = ev.kind == EventKind.ALLOC
    for size in info["sizes"]:
        mine = alloc & (ev.size == size)
        assert mine.sum() == per_thread
        (thread,) = np.unique(ev.thread[mine])
        assert cap.threads[thread].native_id == info["ids"][str(size)]
        top = cap.stack(ev.stack[np.flatnonzero(mine)[0]])[0]
        assert top.filename == f"<worker {size}>" and top.function == f"worker_{size}"
    native = alloc & (ev.size == 777)
    assert native.sum() == 4 * per_thread
    assert not ev.stack[native].any()  # no Python frames on those threads
    assert len(np.unique(ev.thread[native])) == 4


NEW_STACKS = r'''
import sys, threading
import torch, allocscope

path = sys.argv[1]

def worker(t):
    # Thousands of never-seen stacks: strings, frames and nodes are interned
    # while the writer thread writes the tables out.
    for i in range(1500):
        name = f"f_{t}_{i}"
        scope = {"torch": torch}
        exec(compile(f"def {name}():\n    return torch.empty({i % 7 + 1})\n", f"<gen {t} {i}>", "exec"), scope)
        scope[name]()

with allocscope.record(path, device="cpu"):
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
'''


def test_tables_written_while_new_stacks_are_interned_stay_consistent(tmp_path):
    path = tmp_path / "stacks.alsc"
    result = run_python(NEW_STACKS, str(path), timeout=300)
    assert result.returncode == 0, result.stderr
    cap = allocscope.load(path)  # a table entry written before what it names would be corrupt
    ev = cap.events
    tops = {cap.stack(s)[0].filename for s in np.unique(ev.stack[ev.kind == EventKind.ALLOC]) if s}
    assert sum(f.startswith("<gen ") for f in tops) == 4 * 1500
