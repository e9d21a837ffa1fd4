"""Real programs, in the forms people write them, recorded whole (issue 44):
transformers imported before torch, `python -m`, multiprocessing spawn
behind a __main__ guard, DataLoader workers forked, a script that ends with
os._exit, accelerate launch and torchrun, an engine process that serves
while its parent waits (vLLM's shape), ended by SIGTERM with a handler or
without, or orphaned by its parent, or spawned by a parent that initialized
CUDA. Each process that used CUDA leaves a complete capture whose peak
reserved is torch's own in that process (the scripts append torch's
figures to a file), under `run`, `run --watch` and `fit`, on the virtual
GPU."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import allocscope
from allocscope.allocator.recorded import recorded_reserved
from allocscope.capture.runs import run_files
from allocscope.common.errors import InputError

from ..conftest import ROOT
from .test_frameworks import optional

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
FORMS = os.path.join(SCRIPTS, "process_forms.py")

pytestmark = pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")


def _console_script(name):
    """A console script of this Python's environment (torchrun, accelerate)."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.path.exists(path) else None


def _command(form, tmp_path):
    """The command line of a form, as a user types it, and the cards it needs."""
    if form == "hf_first":
        optional("transformers")
        return [sys.executable, os.path.join(SCRIPTS, "hf_first.py")], "H100-80GB"
    if form == "probe_first":
        (tmp_path / "probe.py").write_text(PROBE)
        return [sys.executable, str(tmp_path / "probe.py")], "H100-80GB"
    if form == "module":
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "__init__.py").write_text("")
        shutil.copy(FORMS, tmp_path / "pkg" / "train.py")
        return [sys.executable, "-m", "pkg.train", "plain"], "H100-80GB"
    if form == "torchrun":
        torchrun = _console_script("torchrun")
        return [torchrun, "--standalone", "--nproc-per-node", "2", FORMS, "plain"], "2xH100-80GB"
    if form == "accelerate":
        optional("accelerate")
        accelerate = _console_script("accelerate")
        return [accelerate, "launch", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no", FORMS, "accelerate"], "H100-80GB"
    return [sys.executable, FORMS, form], "2xH100-80GB" if form == "spawn" else "H100-80GB"


# The two lines transformers and vLLM run before they import torch.
PROBE = textwrap.dedent("""\
    import importlib.util
    assert importlib.util.find_spec("torch") is not None
    import json, os, torch
    x = torch.empty(3 << 20, device="cuda")
    with open(os.environ["FORMS_TRUTH"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "max_reserved": torch.cuda.max_memory_reserved()}) + "\\n")
""")

# form -> its exit status
FORMS_RUN = {"probe_first": 0, "hf_first": 0, "module": 0, "spawn": 0, "dataloader_fork": 0, "os_exit": 0,
             "torchrun": 0, "accelerate": 0, "engine": 0, "engine_orphaned": 128 + 9, "engine_daemon": 0,
             "engine_spawned": 0}


# the models a watch names in each form (train()'s Sequential, but for these)
WATCHED = {"hf_first": ["GPT2LMHeadModel"], "probe_first": [], "dataloader_fork": ["Linear", "Sequential"]}


def _run(tmp_path, form, *flags, tool="run"):
    """Runs the form under `allocscope run` (with flags) or `fit`; its
    result, the captures written, and torch's own figures per pid."""
    cmd, gpu = _command(form, tmp_path)
    truth = tmp_path / "truth.jsonl"
    env = dict(os.environ, FORMS_TRUTH=str(truth))
    if tool == "run":
        args = ["run", "--gpu", gpu, *flags, "-o", str(tmp_path / "forms.alsc"), "--", *cmd]
    else:
        args = ["fit", "--gpu", gpu, "--json", "--output-dir", str(tmp_path / "fit"), "--", *cmd]
    result = subprocess.run([sys.executable, "-m", "allocscope", *args], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path, env=env)
    said = {}
    for line in truth.read_text().splitlines() if truth.exists() else ():
        said[json.loads(line)["pid"]] = json.loads(line)["max_reserved"]
    try:  # (none written: the assertions show the run's stderr)
        paths = run_files(str(tmp_path / "forms.alsc") if tool == "run" else str(tmp_path / "fit" / f"{gpu}.alsc"))
    except InputError:
        paths = []
    return result, [allocscope.load(p) for p in paths], said


def _assert_each_process_recorded(form, result, caps, said):
    assert result.returncode == FORMS_RUN[form], result.stderr[-3000:]
    assert said, result.stderr[-3000:]
    # One capture per process that used CUDA (a forked DataLoader worker or
    # a launcher that never did writes none), each complete, each with the
    # peak reserved torch saw in that process.
    assert sorted(c.metadata["pid"] for c in caps) == sorted(said), result.stderr[-3000:]
    for cap in caps:
        assert cap.complete, (cap.path, result.stderr[-3000:])
        assert int(recorded_reserved(cap).max()) == said[cap.metadata["pid"]], cap.path


@pytest.mark.parametrize("form", list(FORMS_RUN))
def test_each_form_records_every_process_that_used_cuda(tmp_path, form):
    result, caps, said = _run(tmp_path, form)
    _assert_each_process_recorded(form, result, caps, said)
    if form == "os_exit" or form in ("engine", "engine_orphaned"):
        # multiprocessing's forked children leave by os._exit, and so does the script
        assert [c.footer["reason"] for c in caps] == ["os._exit"]
    if form == "engine_daemon":
        # the parent's exit terminated it (multiprocessing's daemonic children): SIGTERM's default action
        assert [c.footer["reason"] for c in caps] == ["SIGTERM"]
    if form == "engine_orphaned":
        # The parent's death ended the command; the engine finished its file a
        # second later, and `run` waited for it: the capture was complete
        # when run returned (above) and listed.
        assert "allocscope: wrote forms.alsc" in result.stderr


@pytest.mark.torch_agnostic  # the harness's and the exit's logic; each form runs on both torches above
@pytest.mark.parametrize("form", list(FORMS_RUN))
def test_each_form_under_fit(tmp_path, form):
    result, caps, said = _run(tmp_path, form, tool="fit")
    if FORMS_RUN[form] != 0:
        assert result.returncode == 1, result.stderr[-3000:]  # it does not fit everywhere: "failed"
        result.returncode = FORMS_RUN[form]
    _assert_each_process_recorded(form, result, caps, said)
    card = json.loads(result.stdout)["cards"][0]
    # the card's process: the one that reserved the most (engine_spawned's parent reserved nothing)
    assert card["peak_reserved_bytes"] == max(said.values()) > 0
    assert card["verdict"] == ("fits" if FORMS_RUN[form] == 0 else "failed")
    assert card["watched"] == WATCHED.get(form, ["Sequential"])


@pytest.mark.torch_agnostic  # as above
@pytest.mark.parametrize("form", ["hf_first", "spawn", "engine"])
def test_forms_under_run_watch(tmp_path, form):
    result, caps, said = _run(tmp_path, form, "--watch")
    _assert_each_process_recorded(form, result, caps, said)
    from allocscope.attribution import attribute

    for cap in caps:
        assert sorted(w.get("name") for w in attribute(cap).watches) == WATCHED.get(form, ["Sequential"])


def test_a_run_whose_processes_have_no_rank_reports_them_all(tmp_path):
    result, caps, said = _run(tmp_path, "spawn")
    _assert_each_process_recorded("spawn", result, caps, said)
    r = subprocess.run([sys.executable, "-m", "allocscope", "report", "--json", "forms.alsc"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert sorted(row["process"] for row in doc["ranks"]) == sorted(f"pid {pid}" for pid in said)
    assert {row["peak_reserved_bytes"] for row in doc["ranks"]} == set(said.values())
    assert os.path.basename(doc["worst_capture"]) in [os.path.basename(c.path) for c in caps]
    assert doc["worst_process"].startswith("pid ")
    text = subprocess.run([sys.executable, "-m", "allocscope", "report", "forms.alsc"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path).stdout
    assert text.startswith("allocscope: 2 processes") and f"{doc['worst_process']} (the worst):" in text


# ---- the import hook itself (common/torch_hook.py)

HOOK = textwrap.dedent("""\
    import importlib, importlib.metadata, importlib.util, pkgutil, sys
    from allocscope.common.torch_hook import after_torch_import

    seen = []
    after_torch_import(lambda: seen.append(hasattr(sys.modules["torch"], "cuda")))
    # what libraries do before they import torch: none of it runs the callback, and none removes the hook
    assert importlib.util.find_spec("torch") is not None
    assert importlib.util.find_spec("torch") is not None
    importlib.metadata.version("torch")
    [m for m in pkgutil.iter_modules() if m.name == "torch"]
    importlib.util.find_spec("json")
    assert seen == [] and "torch" not in sys.modules
    import torch
    assert seen == [True], seen  # once, after torch's module ran
    after_torch_import(lambda: seen.append("later"))  # torch loaded: at once
    assert seen == [True, "later"]
    assert not any(type(f).__name__ == "_ImportHook" for f in sys.meta_path)
    print("ok")
""")


@pytest.mark.torch_agnostic  # the import system's, not torch's
def test_the_torch_import_hook_survives_probes_and_leaves_once_torch_is_loaded(tmp_path):
    (tmp_path / "hook.py").write_text(HOOK)
    r = subprocess.run([sys.executable, str(tmp_path / "hook.py")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


AFTER_IMPORT = textwrap.dedent("""\
    import importlib.util, sys
    if sys.argv[1] == "probe":
        importlib.util.find_spec("torch")
    import torch.distributed.distributed_c10d as c10d
    print(getattr(c10d, "_allocscope_patched", False))
""")


@pytest.mark.torch_agnostic
def test_the_virtual_gpus_after_import_steps_run_after_a_probe_too(tmp_path):
    """Under --no-record, the virtual GPU's after-import steps (its object
    collectives patched, its exit grace) run whether torch was probed for
    first or not."""
    (tmp_path / "after.py").write_text(AFTER_IMPORT)
    said = []
    for order in ("import", "probe"):
        r = subprocess.run([sys.executable, "-m", "allocscope", "run", "--gpu", "H100-80GB", "--no-record", "--",
                            sys.executable, str(tmp_path / "after.py"), order], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        said.append(r.stdout.strip())
    assert said == ["True", "True"]


# ---- finishing a capture at os._exit, and run's wait for it (recording/exits.py, harness/child.py)

@pytest.mark.torch_agnostic
def test_a_capture_is_locked_while_it_is_written(tmp_path):
    from allocscope.harness.child import _being_written

    code = textwrap.dedent(f"""\
        import sys, time, torch, allocscope
        rec = allocscope.record({str(tmp_path / 'held.alsc')!r}, device="cpu").__enter__()
        print("recording", flush=True)
        sys.stdin.readline()
        rec.stop()
        print("stopped", flush=True)
        sys.stdin.readline()
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "recording"
        assert _being_written(str(tmp_path / "held.alsc"))
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "stopped"
        assert not _being_written(str(tmp_path / "held.alsc"))
    finally:
        child.stdin.close()
        child.wait(60)
    assert allocscope.load(tmp_path / "held.alsc").complete


@pytest.mark.torch_agnostic
def test_os_exit_in_a_forked_child_leaves_the_parents_recording_alone(tmp_path):
    """A child forked while the parent records (a DataLoader worker) leaves
    by os._exit: nothing of the parent's is stopped or written there."""
    code = textwrap.dedent(f"""\
        import os, torch, allocscope
        with allocscope.record({str(tmp_path / 'parent.alsc')!r}, device="cpu"):
            x = torch.empty(12345)
            pid = os.fork()
            if pid == 0:
                torch.empty(777)
                os._exit(7)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 7
            y = torch.empty(54321)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    cap = allocscope.load(tmp_path / "parent.alsc")
    assert cap.complete and cap.footer["reason"] == "stopped"
    sizes = set(cap.events.size.tolist())
    assert {12345 * 4, 54321 * 4} <= sizes and 777 * 4 not in sizes


@pytest.mark.torch_agnostic
def test_os_exit_from_a_signal_handler_in_the_middle_of_stop_finishes_the_file(tmp_path):
    """A SIGTERM handler that calls os._exit can run while the same thread
    is inside stop(): the exit finishes the capture instead of waiting on
    stop's lock forever (stood in for by os._exit from inside stop)."""
    code = textwrap.dedent(f"""\
        import os, torch, allocscope
        from allocscope.recording import session
        rec = allocscope.record({str(tmp_path / 'mid.alsc')!r}, device="cpu").__enter__()
        x = torch.empty(4321)
        uninstall = session.Recording._uninstall
        def signal_arrives(self, C):
            session.Recording._uninstall = uninstall
            os._exit(5)
        session.Recording._uninstall = signal_arrives
        rec.stop()
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 5, r.stderr[-3000:]
    cap = allocscope.load(tmp_path / "mid.alsc")
    assert cap.complete and cap.footer["reason"] == "os._exit" and (cap.events.size == 4321 * 4).any()
