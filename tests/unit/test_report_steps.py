"""report --steps: a report over some optimizer steps of a long capture:
their peak (not the capture's), their iterations, their timeline, the
allocator's state at their peak of reserved memory; and one-line errors for
steps the capture does not have."""

import json
import os

import pytest

import allocscope
from allocscope.cli import main
from allocscope.reports.report import StepsNotFound, build_report, step_window

from ..conftest import DATA
from ..support.training_run import training_run

pytestmark = pytest.mark.torch_agnostic


@pytest.fixture(scope="module")
def long_capture(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("steps") / "long.alsc")
    training_run(path, 20_000, device="cuda", layers=3, hidden=256, batch=64)
    return allocscope.load(path)


def test_a_window_reports_its_own_peak_and_iterations(long_capture):
    cap = long_capture
    whole = build_report(cap)
    lo, hi = step_window(cap, 5, 7)
    r = build_report(cap, steps=(5, 7))
    assert r["steps"] == {"first": 5, "last": 7, "first_event": lo, "last_event": hi}
    assert [i["iteration"] for i in r["iterations"]] == [5, 6, 7]
    assert lo == r["iterations"][0]["first_event"] and hi == r["iterations"][-1]["last_event"]
    # the window's peak lies in the window and is its highest moment
    peak = r["peak"]
    assert lo <= peak["event"] <= hi
    assert peak["allocated_bytes"] == max(i["peak_allocated_bytes"] for i in r["iterations"])
    assert peak["allocated_bytes"] <= whole["peak"]["allocated_bytes"]
    assert all(lo <= e <= hi for e in r["timeline"]["event"])
    # the allocator's state is replayed at the window's peak of reserved memory
    assert lo <= r["allocator"]["state_at"] <= hi + 1
    assert lo <= r["peak_reserved"]["event"] <= hi


def test_steps_through_the_cli_and_their_errors(long_capture, capsys):
    assert main(["report", long_capture.path, "--steps", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["steps"]["first"] == r["steps"]["last"] == 3
    assert main(["report", long_capture.path, "--steps", "2-4"]) == 0
    assert "of steps 2-4 (events" in capsys.readouterr().out
    for args, message in ((["--steps", "9999"], "no iterations 9999-9999"),
                          (["--steps", "4-2"], "steps run from a first to a last"),
                          (["--steps", "x"], "is not a step or a range"),
                          (["--steps", "1", "--at", "step 1"], "cannot be used together")):
        try:
            rc = main(["report", long_capture.path, *args])
        except SystemExit as e:  # argparse's own errors
            rc = e.code
        err = capsys.readouterr().err
        assert rc == 2 and message in err and "Traceback" not in err, (args, err)


def test_captures_without_iterations_say_so():
    cap = allocscope.load(os.path.join(DATA, "cpu_train_v1.alsc"))
    with pytest.raises(StepsNotFound, match="no iterations"):
        build_report(cap, steps=(0, 1))


def test_memory_outside_the_allocator_that_shrank_is_not_explained_as_growth(long_capture):
    # The synthetic run's end baseline holds more reserved memory than its
    # start with the same free figure: outside the allocator it shrank.
    gap = {g["item"]: g for g in build_report(long_capture)["gap"]}
    detail = gap["outside_allocator"]["detail"]
    assert "was released since" in detail and "bytes less" not in detail


@pytest.fixture(scope="module")
def chunked_capture(tmp_path_factory):
    """A long run in small event chunks, as the recorder writes them (its end
    baseline after the events), so that a partial read can stop early."""
    path = str(tmp_path_factory.mktemp("chunked") / "long.alsc")
    info = training_run(path, 20_000, device="cuda", layers=3, hidden=256, batch=64, events_per_chunk=1000)
    return path, info


def _without_capture_header(report):
    return {k: v for k, v in report.items() if k != "capture"}


def test_steps_read_only_the_part_of_the_file_they_need(chunked_capture):
    path, info = chunked_capture
    whole = allocscope.load(path)
    part = allocscope.load(path, through_step=7)
    assert not whole.partial and part.partial
    # stopped in the chunk where step 9 starts: far from the end, step 8 whole
    assert 9 <= part.read_until_step < 15
    assert len(part.events) < len(whole.events) // 10
    assert step_window(part, 8, 8) == step_window(whole, 8, 8)
    # what follows the read is known from the footer and the end baseline
    assert part.complete and part.events_in_file == len(whole.events) == info["events"]
    assert [b["label"] for b in part.baselines] == [b["label"] for b in whole.baselines] == ["start", "end"]
    # the events read are the file's first ones, unchanged
    n = len(part.events)
    assert (part.events.seq == whole.events.seq[:n]).all() and (part.events.addr == whole.events.addr[:n]).all()
    for steps in ((5, 7), (7, 7), (0, 2)):
        a, b = build_report(whole, steps=steps), build_report(part, steps=steps)
        assert _without_capture_header(a) == _without_capture_header(b), steps
        assert b["capture"]["partial"] == {"until_step": part.read_until_step, "events_in_file": len(whole.events)}
        assert "partial" not in a["capture"]


def test_a_read_through_the_last_step_reads_everything(chunked_capture):
    path, info = chunked_capture
    # the last iteration (numbered steps - 1) is the tail after the last
    # optimizer step: no phase comes after it, so the read goes to the end
    cap = allocscope.load(path, through_step=info["steps"] - 3)
    assert not cap.partial and cap.events_in_file is None and len(cap.events) == info["events"]
    # the start of the tail is in the last events chunk: nothing is left unread
    cap = allocscope.load(path, through_step=info["steps"] - 2)
    assert cap.complete and not cap.partial and len(cap.events) == info["events"]
    with pytest.raises(ValueError, match="through_step"):
        allocscope.load(path, through_step=-1)


def test_a_partial_read_of_a_file_without_its_end(chunked_capture, tmp_path):
    path, _ = chunked_capture
    data = open(path, "rb").read()
    cut = tmp_path / "cut.alsc"
    cut.write_bytes(data[:len(data) * 2 // 3])
    with pytest.warns(allocscope.TruncatedCaptureWarning):
        whole = allocscope.load(str(cut))
    part = allocscope.load(str(cut), through_step=3)  # stops long before the cut: nothing to warn about
    assert part.partial and not part.complete and part.events_in_file is None
    a, b = build_report(whole, steps=(2, 3)), build_report(part, steps=(2, 3))
    # the whole read warns of the cut it reached; the partial one never saw it
    assert any("ends inside" in w for w in a.pop("warnings")) and b.pop("warnings") == []
    assert _without_capture_header(a) == _without_capture_header(b)
    assert not b["capture"]["complete"]


def test_steps_from_the_cli_say_what_was_read(chunked_capture, capsys):
    path, info = chunked_capture
    assert main(["report", path, "--steps", "4", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["capture"]["partial"]["events_in_file"] == info["events"] > r["capture"]["events"]
    assert main(["report", path, "--steps", "4"]) == 0
    assert f"read of {info['events']} (up to the start of step" in capsys.readouterr().out


def test_sites_and_ops_of_steps_count_the_allocations_of_those_steps(chunked_capture):
    path, _ = chunked_capture
    cap = allocscope.load(path)
    lo, hi = step_window(cap, 5, 6)
    r = build_report(cap, steps=(5, 6))
    ev = cap.events
    allocs = int(((ev.kind[lo:hi + 1] == allocscope.EventKind.ALLOC)).sum())
    assert sum(s["allocations"] for s in r["sites"]) <= allocs
    assert sum(o["allocations"] for o in build_report(cap, steps=(5, 6), top=1000)["ops"]) == allocs
    whole = build_report(cap, top=1000)
    assert sum(o["allocations"] for o in whole["ops"]) == int((ev.kind == allocscope.EventKind.ALLOC).sum())
