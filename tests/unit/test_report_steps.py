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
