"""Bounds on a run (recording/limits.py): a loop that never ends stops within the bound the user set, with one
line naming where the program was, and its capture finished."""

import json
import subprocess
import sys
import textwrap

import pytest

import allocscope
from allocscope.recording.limits import LIMIT_STATUS

pytestmark = pytest.mark.torch_agnostic

FOREVER = textwrap.dedent("""
    import torch

    def decode(cache):
        while True:                                  # a stop flag no kernel computes, say
            cache.append(torch.empty(1024, device="cuda"))
            if len(cache) > 64:
                cache.clear()

    decode([])
""")


def _allocscope(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "allocscope", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_a_loop_past_max_events_stops_naming_the_loop_and_its_capture_is_finished(tmp_path):
    script = tmp_path / "forever.py"
    script.write_text(FOREVER)
    capture = tmp_path / "forever.alsc"
    p = _allocscope("run", "--gpu", "L4-24GB", "--max-events", "5000", "-o", str(capture), "--",
                    sys.executable, str(script))
    assert p.returncode == LIMIT_STATUS, p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if "stopped" in ln]
    # where the watchdog found it: a line of the loop (which one depends on when it looked)
    assert "--max-events 5,000" in line and any(f"it was in decode ({script}:{n})" in line for n in range(5, 9))
    cap = allocscope.load(capture)
    assert cap.complete and cap.footer["reason"] == "limit" and len(cap.events) > 5000


def test_max_time_stops_a_run_without_recording(tmp_path):
    script = tmp_path / "forever.py"
    script.write_text(FOREVER)
    # (8 s: on a loaded machine importing torch alone took over 2, and the stop then found the script at its import)
    p = _allocscope("run", "--gpu", "L4-24GB", "--no-record", "--max-time", "8", "--", sys.executable, str(script))
    assert p.returncode == LIMIT_STATUS
    assert "ran for 8 s (--max-time); it was in decode" in p.stderr and "Traceback" not in p.stderr


def test_fit_reports_a_run_stopped_at_a_bound_as_failed(tmp_path):
    script = tmp_path / "forever.py"
    script.write_text(FOREVER)
    p = _allocscope("fit", "--gpu", "L4-24GB", "--max-events", "5000", "--json", "-o", str(tmp_path / "fit"), "--",
                    sys.executable, str(script))
    doc = json.loads(p.stdout)
    (card,) = doc["cards"]
    assert p.returncode == 1 and card["verdict"] == "failed" and card["exit_status"] == LIMIT_STATUS
    assert "it was in decode" in p.stderr


@pytest.mark.parametrize("args,message", [(["--max-time", "0"], "--max-time is a number of seconds > 0"),
                                          (["--max-events", "0"], "--max-events is a number of events >= 1"),
                                          (["--max-host-memory", "lots"], "--max-host-memory")])
def test_bad_bounds_are_one_line_errors(args, message):
    p = _allocscope("run", "--gpu", "L4-24GB", "--no-record", *args, "--", sys.executable, "-c", "pass")
    assert p.returncode != 0 and message in p.stderr and "Traceback" not in p.stderr
