"""make conformance: PyTorch's own tests, run on the installed torch with
allocscope off and on, test by test the same.

PyTorch's tests at the releases we support are in no registry package, and
its repository is too large to fetch here; Debian's source package of
PyTorch carries them (its upstream tarball, 27 MB). It is fetched once,
checked against its pinned SHA-256 and cached outside the repository
($ALLOCSCOPE_CONFORMANCE_CACHE, else ~/.cache/allocscope/conformance);
nothing of PyTorch's is committed.

Suites (SUITES), each a set of PyTorch's test files run in every mode:
- autograd: test_autograd.py on the CPU, plain and under `allocscope run
  --device cpu --watch` (recording, and every model watched when first
  called: allocscope's autograd engine and its grad/backward wrappers);
- cuda_memory: the memory-related tests of test_cuda.py and
  test_cuda_multigpu.py on two virtual H100s, with recording off
  (`--no-record`), on, and watching;
- cuda_memory_expandable: those of test_cuda.py again with expandable
  segments, as test_cuda_expandable_segments.py sets them up
  (expandable_segments.py, a pytest plugin);
- module_hooks, serialization, nn_modules, fx_modules: modules' hooks and
  state dicts, serialization, the module API and parametrizations, FX's
  tracing of modules, on the CPU, plain and under `allocscope run --device
  cpu --watch` with every module watched as it is built (watch_modules.py,
  a pytest plugin); names the 2.6 files import that newer torches removed
  are put back for their files to import, and TestFX sets up without the
  torchbind test library the wheels do not ship (wheel_compat.py).

PyTorch's conftest.py is left out (--noconftest): its hooks are written
for an older pytest, and what they add (sharding, rerun bookkeeping) is
CI's. The garbage collector runs before each test, in every mode
(collect_garbage.py): a test that meets what an earlier one left in a
reference cycle then does not depend on when the collector last ran.

A difference a watch makes by design (what torch's global hook registry
shows a test that counts its entries) is explained once in
known_differences.txt; the document lists it apart, and it does not fail
the run. A test's result is its outcome (passed, failed, error, skipped) and its
message's first line, numbers and addresses left out (a time, a pointer,
a process id differ from run to run). The document (JSON) holds each
mode's counts, every test's result (per_test: one where the modes agree,
each mode's where they do not), every test whose result differs between
modes, and for
each CUDA capture a mode wrote whether its replay follows it exactly; the
run fails where a test differs or a replay does not follow. Tests that fail in every mode (their age
against the installed torch; kernels compute nothing on a virtual GPU)
are no difference: each is explained once, with its reason, in
known_failures.txt (fnmatch patterns by suite); the document counts them by
reason and lists those it does not explain. A test that takes the whole
process down on some torch, allocscope off too, is run by no mode there:
deselected.txt says which, on which torches, and why (the document lists
them).

    python tests/conformance/run.py [--suite autograd] [--subset] [--out FILE] [--keep DIR]
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))

# Debian's source package of PyTorch: its upstream tarball, pinned. A newer
# version that reaches Debian's packages is one more entry (--source).
SOURCES = {
    "2.6.0+dfsg": ("http://deb.debian.org/debian/pool/main/p/pytorch/pytorch_2.6.0+dfsg.orig.tar.xz",
                   "099a9601bc40d67656e75735c44abedb0fbe92d08817852ab7472eebb7e6ddff"),
}
DEFAULT_SOURCE = "2.6.0+dfsg"

MEMORY_TESTS = "memory or caching or alloc or empty_cache or mempool or graph"
VGPU = "2xH100-80GB"


def _allocscope(*options: str) -> list[str]:
    return [sys.executable, "-m", "allocscope", "run", *options, "--"]


CUDA_MODES = {"off": _allocscope("--gpu", VGPU, "--no-record"),
              "recording": _allocscope("--gpu", VGPU, "--no-watch", "-f", "-o", "{capture}"),
              "watching": _allocscope("--gpu", VGPU, "--watch", "-f", "-o", "{capture}")}

# The module suites: what the 2.6 files need that the wheel lacks
# (wheel_compat.py); watched, every module is watched as it is built.
MODULE_SUITE = {
    "plugins": ["wheel_compat"],
    "modes": {"plain": [], "watched": _allocscope("--device", "cpu", "--watch", "-f", "-o", "{capture}")},
    "mode_plugins": {"watched": ["watch_modules"]},
}

SUITES: dict[str, dict] = {
    "autograd": {
        "files": ["test_autograd.py"],
        "select": None,
        "modes": {"plain": [], "watched": _allocscope("--device", "cpu", "--watch", "-f", "-o", "{capture}")},
    },
    "cuda_memory": {
        "files": ["test_cuda.py", "test_cuda_multigpu.py"],
        "select": MEMORY_TESTS,
        "modes": CUDA_MODES,
    },
    # test_cuda_expandable_segments.py sets expandable segments only when
    # started as a script; under pytest it is test_cuda.py again: its setup
    # is done by a plugin of ours
    "cuda_memory_expandable": {
        "files": ["test_cuda.py"],
        "select": MEMORY_TESTS,
        "plugins": ["expandable_segments"],
        "modes": CUDA_MODES,
    },
    # What a watch must leave as it was (issue 62): modules' hooks and state
    # dicts, serialization, parametrizations and the module API, FX's
    # tracing of modules; plain, and with every module watched from its
    # construction (watch_modules.py), under `allocscope run --device cpu`
    "module_hooks": {
        "files": ["nn/test_module_hooks.py", "nn/test_load_state_dict.py"],
        "select": None,
        **MODULE_SUITE,
    },
    "serialization": {
        "files": ["test_serialization.py"],
        "select": None,
        **MODULE_SUITE,
    },
    "nn_modules": {
        "files": ["test_nn.py", "nn/test_parametrization.py"],
        "select": "TestNN and not TestNNDeviceType",
        **MODULE_SUITE,
    },
    "fx_modules": {
        "files": ["test_fx.py"],
        "select": "TestFX or TestSubgraphRewriter or TestConstFold or TestDCE",
        **MODULE_SUITE,
    },
}


# make test's fixed subset (--subset; tests/integration/test_conformance.py):
# in each mode, what the full suites found (TorchScript calling
# torch.autograd.grad under a watch; caching turned off at run time and
# allocations past the cache; the allocator's statistics, out-of-memory
# retries, blocks in the middle of a segment, private pools) in a few
# tests, not the hours of the full run
SUBSET = {
    "autograd": "test_fork_join_in_middle or test_grad_nonleaf or test_saved_variable_packing or test_saved_tensor_hooks",
    "cuda_memory": ("test_cachingAllocator_raw_alloc or test_memory_allocation or test_out_of_memory or "
                    "test_allocated_in_middle_of_segment or test_middle_allocations_contiguous or "
                    "test_check_pool_live_allocations or test_mempool_id or (test_memory_stats and not graphs)"),
    # a module watched as it is built: its hooks, a load_state_dict that swaps tensors
    "module_hooks": ("test_always_called_forward_hooks or test_forward_hooks or test_load_state_dict_swap or "
                     "test_load_state_dict_child or test_state_dict_pre_hook"),
}


def cache_dir() -> str:
    return os.environ.get("ALLOCSCOPE_CONFORMANCE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "allocscope", "conformance")


def fetch(version: str) -> str:
    """The folder of PyTorch's test/ from Debian's source package `version`
    (downloaded and checked once, then cached)."""
    url, sha256 = SOURCES[version]
    root = os.path.join(cache_dir(), version)
    tests = os.path.join(root, "test")
    if os.path.isdir(tests):
        return tests
    os.makedirs(root, exist_ok=True)
    archive = os.path.join(root, os.path.basename(url))
    if not os.path.exists(archive):
        with urllib.request.urlopen(url, timeout=300) as response, open(archive + ".part", "wb") as f:
            while chunk := response.read(1 << 20):
                f.write(chunk)
        os.replace(archive + ".part", archive)
    digest = hashlib.sha256()
    with open(archive, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        os.remove(archive)
        raise SystemExit(f"conformance: {url} is not the pinned tarball (sha256 {digest.hexdigest()})")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.split("/")[1:2] == ["test"]
                   and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name.split("/", 1)[1]  # (pytorch-v2.6.0/test/... -> test/...)
        tar.extractall(root, members=members, filter="data")
    return tests


_VARYING = re.compile(r"0x[0-9a-fA-F]+|\d+(\.\d+)?")
KNOWN_FAILURES = os.path.join(HERE, "known_failures.txt")
KNOWN_DIFFERENCES = os.path.join(HERE, "known_differences.txt")
DESELECTED = os.path.join(HERE, "deselected.txt")


def deselected(suite: str, torch_version: str, path: str = DESELECTED) -> dict[str, str]:
    """{test node id: reason} for the tests of `suite` no mode runs on this
    torch (deselected.txt: they take the process down, allocscope off too)."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                suites, test, versions, reason = line.rstrip("\n").split("\t")
                if fnmatch.fnmatchcase(suite, suites) and fnmatch.fnmatchcase(torch_version, versions):
                    out[test] = reason
    return out


def known_failures(path: str = KNOWN_FAILURES) -> list[tuple[str, str, str]]:
    """(suite pattern, test pattern, reason) for each line of known_failures.txt: the
    tests that fail in every mode, allocscope off too, and why (or of
    known_differences.txt: the tests whose result a watch changes by design, and why)."""
    out = []
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                suite, pattern, reason = line.rstrip("\n").split("\t")
                out.append((suite, pattern, reason))
    return out


def explain(suite: str, failing: list[str], known: list[tuple[str, str, str]]) -> dict:
    """Tests failing in every mode, by their reason in known_failures.txt; the rest unexplained."""
    by_reason: dict[str, int] = {}
    unexplained = []
    for test in failing:
        reason = next((r for s, p, r in known if fnmatch.fnmatchcase(suite, s) and fnmatch.fnmatchcase(test, p)), None)
        if reason is None:
            unexplained.append(test)
        else:
            by_reason[reason] = by_reason.get(reason, 0) + 1
    return {"by_reason": by_reason, "unexplained": unexplained}


def results(junit: str) -> dict[str, tuple[str, str]]:
    """{test id: (outcome, message's first line with numbers left out)} from pytest's JUnit XML."""
    out: dict[str, tuple[str, str]] = {}
    if not os.path.exists(junit):
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag if child.tag != "skipped" or child.get("type") != "pytest.xfail" else "xfailed"
                message = (child.get("message") or "").strip().splitlines()[:1]
                message = _VARYING.sub("#", message[0]) if message else ""
                break
        out[test] = (outcome, message)
    return out


def replays(capture: str) -> dict[str, object]:
    """Each CUDA capture the mode wrote (a process's own: FILE.pidN.alsc
    beside FILE), replayed: whether the replay follows it exactly."""
    import allocscope
    from allocscope.allocator.replay import replay

    from allocscope.common.errors import InputError

    out: dict[str, object] = {}
    stem = capture[:-len(".alsc")]
    for path in sorted(glob.glob(glob.escape(stem) + "*.alsc")):
        try:
            cap = allocscope.load(path, salvage=True)
        except InputError as e:  # (an empty file: the mode's process never wrote its capture)
            out[os.path.basename(path)] = {"events": 0, "exact": False, "error": str(e)}
            continue
        if "cuda" not in (cap.metadata.get("devices_recorded") or ()):
            continue
        fidelity = replay(cap).fidelity
        f = fidelity.to_json() if fidelity else {}
        out[os.path.basename(path)] = {"events": len(cap.events), "exact": bool(f.get("exact")),
                                       "first_mismatch": f.get("first_mismatch")}
    return out


def run_suite(name: str, tests_dir: str, work: str, timeout: int, torch_version: str, subset: bool = False) -> dict:
    suite = dict(SUITES[name], select=SUBSET[name]) if subset else SUITES[name]
    per_mode: dict[str, dict[str, tuple[str, str]]] = {}
    left_out = deselected(name, torch_version)
    doc: dict = {"files": suite["files"], "select": suite["select"], "deselected": left_out, "modes": {}}
    for mode, prefix in suite["modes"].items():
        junit = os.path.join(work, f"{name}.{mode}.xml")
        capture = os.path.join(work, f"{name}.{mode}.alsc")
        command = [a.replace("{capture}", capture) for a in prefix] + [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=",
            "-o", "faulthandler_timeout=300", "--tb=no", "--noconftest",
            f"--junitxml={junit}",
            *[a for name in ("collect_garbage", *suite.get("plugins", ()), *suite.get("mode_plugins", {}).get(mode, ()))
              for a in ("-p", name)],
            *suite["files"], *(["-k", suite["select"]] if suite["select"] else []),
            *(f"--deselect={test}" for test in left_out)]
        # (C++ extensions the tests build, in a folder of this run's: another
        # torch's build of the same name, or a lock a killed build left, would
        # make load_inline wait for ever)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p),
                   TORCH_EXTENSIONS_DIR=os.path.join(work, "torch_extensions"))
        started = time.monotonic()
        p = subprocess.Popen(command, cwd=tests_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        try:
            output, _ = p.communicate(timeout=timeout)
            status: int | str = p.returncode
        except subprocess.TimeoutExpired:  # a test that never ends (faulthandler's dump says where it waits)
            os.killpg(p.pid, signal.SIGKILL)
            output, _ = p.communicate()
            status = "timed out"
        got = per_mode[mode] = results(junit)
        counts: dict[str, int] = {}
        for outcome, _ in got.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        shown = " ".join("python" if a == sys.executable else os.path.basename(a) if a == capture else a
                         for a in command)
        doc["modes"][mode] = {"command": shown, "exit_status": status, "wall_s": round(time.monotonic() - started, 1),
                              "tests": len(got), "counts": counts}
        if not got:
            doc["modes"][mode]["output_tail"] = output[-6000:]
        if "{capture}" in prefix:
            doc["modes"][mode]["replays"] = replays(capture)
    tests = sorted(set().union(*per_mode.values()))
    differences = []
    for test in tests:
        seen = {mode: per_mode[mode].get(test, ("not run", "")) for mode in per_mode}
        if len(set(seen.values())) > 1:
            differences.append({"test": test, **{m: list(r) for m, r in seen.items()}})
    doc["tests"] = len(tests)
    # A difference known_differences.txt explains (what the design makes
    # visible, e.g. torch's global hook registry) is listed with its
    # reason; any other fails the run.
    known = known_failures(KNOWN_DIFFERENCES)
    doc["explained_differences"] = [
        d | {"reason": r} for d in differences
        for r in [next((r for s, p, r in known if fnmatch.fnmatchcase(name, s) and fnmatch.fnmatchcase(d["test"], p)),
                       None)] if r is not None]
    explained = {d["test"] for d in doc["explained_differences"]}
    differences = [d for d in differences if d["test"] not in explained]
    doc["differences"] = differences
    # every test's result: one [outcome, message] where every mode agrees,
    # else each mode's (those are the differences above too)
    doc["per_test"] = {}
    for test in tests:
        seen = {mode: list(per_mode[mode].get(test, ("not run", ""))) for mode in per_mode}
        same = len({tuple(r) for r in seen.values()}) == 1
        doc["per_test"][test] = next(iter(seen.values())) if same else seen
    failing = [t for t in tests if all(per_mode[m].get(t, ("not run",))[0] in ("failure", "error") for m in per_mode)]
    doc["failing_in_every_mode"] = explain(name, failing, known_failures())
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", action="append", choices=sorted(SUITES), help="default: every suite")
    parser.add_argument("--source", default=DEFAULT_SOURCE, choices=sorted(SOURCES))
    parser.add_argument("--out", help="write the document here (default: stdout)")
    parser.add_argument("--keep", metavar="DIR", help="keep the JUnit files and captures in DIR")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds a mode may take")
    parser.add_argument("--subset", action="store_true",
                        help="make test's fixed subset: a few tests of each suite in SUBSET, in every mode")
    args = parser.parse_args()
    import torch

    tests_dir = fetch(args.source)
    work = args.keep or tempfile.mkdtemp(prefix="allocscope-conformance-")
    os.makedirs(work, exist_ok=True)
    doc = {"benchmark": "conformance", "command": " ".join(["python", "tests/conformance/run.py", *sys.argv[1:]]),
           "torch": torch.__version__, "python": sys.version.split()[0],
           "source": {"debian": f"pytorch {args.source}", "url": SOURCES[args.source][0],
                      "sha256": SOURCES[args.source][1]},
           "suites": {}}
    for name in args.suite or sorted(SUBSET if args.subset else SUITES):
        doc["suites"][name] = run_suite(name, tests_dir, work, args.timeout, torch.__version__, args.subset)
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    differ = {name: len(s["differences"]) for name, s in doc["suites"].items()}
    empty = [f"{name}/{mode}" for name, s in doc["suites"].items() for mode, m in s["modes"].items() if not m["tests"]]
    inexact = [f"{name}/{mode}/{path}" for name, s in doc["suites"].items() for mode, m in s["modes"].items()
               for path, r in (m.get("replays") or {}).items() if not r["exact"]]
    unexplained = sum(len(s["failing_in_every_mode"]["unexplained"]) for s in doc["suites"].values())
    print(f"conformance: {json.dumps(differ)} tests differ between modes"
          + (f"; {unexplained} failing in every mode not in known_failures.txt" if unexplained else "")
          + (f"; no results from {', '.join(empty)}" if empty else "")
          + (f"; replays not exact: {', '.join(inexact)}" if inexact else ""), file=sys.stderr)
    return 1 if any(differ.values()) or empty or inexact else 0


if __name__ == "__main__":
    sys.exit(main())
