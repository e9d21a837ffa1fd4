"""What fit shows while it runs (harness/console.py): a line per run, a bar
over the runs on a terminal only, the end of a failed run's log."""

import io
import os

import pytest

from allocscope.harness.console import FAILED_TAIL_LINES, RunConsole, log_path, tail

pytestmark = pytest.mark.torch_agnostic


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


FITS = {"verdict": "fits", "peak_reserved_bytes": 3 << 30, "exit_status": 0}
OOM = {"verdict": "out of memory", "shortfall_bytes": 512 << 20, "exit_status": 1}


def test_one_line_per_run_and_no_bar_off_a_terminal(tmp_path):
    out = io.StringIO()
    console = RunConsole(4, stream=out, logs=str(tmp_path))
    console.begin("a virtual L4-24GB with B=8")
    console.end("L4-24GB B=8", FITS, 4.24, str(tmp_path / "x.log"))
    console.begin("a virtual L4-24GB with B=16")
    console.end("L4-24GB B=16", OOM, 5.0, str(tmp_path / "y.log"))
    console.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in out.getvalue()
    assert "log beside its capture" in lines[0] and "(--verbose shows it" in lines[0]
    assert "L4-24GB B=8" in lines[1] and "fits, peak reserved 3.00 GiB" in lines[1] and lines[1].endswith("4.2 s")
    assert "out of memory, short by 512.00 MiB" in lines[2]


def test_a_bar_on_a_terminal_is_drawn_and_cleared(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")  # the bar stays on one line of the terminal
    out = Terminal()
    RunConsole(2, stream=out).begin("a virtual T4-16GB with a long name")
    assert max(len(part) for part in out.getvalue().split("\r")) == 39
    monkeypatch.setenv("COLUMNS", "200")
    out = Terminal()
    console = RunConsole(2, stream=out)
    console.begin("a virtual T4-16GB")
    assert "\rallocscope fit [" in out.getvalue() and "0 of 2 runs at most: running a virtual T4-16GB" in out.getvalue()
    console.end("T4-16GB", FITS, 1.0, None)
    assert "1 of 2 runs at most" in out.getvalue()
    console.close()
    assert out.getvalue().endswith("\r\033[K")


def test_a_run_that_failed_otherwise_shows_the_end_of_its_log(tmp_path):
    log = tmp_path / "T4-16GB.log"
    log.write_text("".join(f"line {i}\n" for i in range(40)) + "ValueError: boom\n")
    out = io.StringIO()
    console = RunConsole(1, stream=out)
    console.end("T4-16GB", {"verdict": "failed", "exit_status": 1}, 0.5, str(log))
    text = out.getvalue()
    assert "failed (exit status 1)" in text and "    | ValueError: boom" in text
    assert "    | line 39" in text and "    | line 10\n" not in text  # its last lines only
    assert text.count("    | ") == FAILED_TAIL_LINES and f"all of it: {os.path.relpath(log)}" in text
    # a run out of memory shows no log: the verdict says it all
    out = io.StringIO()
    RunConsole(1, stream=out).end("T4-16GB", OOM, 0.5, str(log))
    assert "boom" not in out.getvalue()


def test_a_failure_whose_cause_scrolled_away_names_its_first_error(tmp_path):
    # a serving engine's core fails, then its client: the cause is the first
    log = tmp_path / "L4-24GB.log"
    log.write_text("(EngineCore pid=314) ERROR 11-27 [core.py:1584] ValueError: To serve at least one request "
                   "with the model's max seq len (131072), 16.0 GiB KV cache is needed\n" +
                   "".join(f"  frame {i}\n" for i in range(30)) +
                   "RuntimeError: Engine core initialization failed. See root cause above.\n")
    out = io.StringIO()
    RunConsole(1, stream=out).end("L4-24GB", {"verdict": "failed", "exit_status": 1}, 0.5, str(log))
    assert ("    the first error in it: ValueError: To serve at least one request with the model's max seq len "
            "(131072), 16.0 GiB KV cache is needed\n") in out.getvalue()
    # where the end of the log shows it already, it is not said twice
    out = io.StringIO()
    log.write_text("line\nValueError: boom\n")
    RunConsole(1, stream=out).end("L4-24GB", {"verdict": "failed", "exit_status": 1}, 0.5, str(log))
    assert "first error" not in out.getvalue()


def test_verbose_says_where_each_run_starts_and_nothing_after():
    out = Terminal()
    console = RunConsole(1, verbose=True, stream=out)
    console.begin("a virtual T4-16GB")
    console.end("T4-16GB", FITS, 1.0, None)
    console.close()
    assert out.getvalue() == "allocscope fit: running a virtual T4-16GB\n"


def test_logs_sit_beside_their_captures(tmp_path):
    assert log_path("out/H100-80GB.B=4.alsc") == "out/H100-80GB.B=4.log"
    (tmp_path / "three.log").write_text("a\nb\nc\n")
    assert tail(str(tmp_path / "three.log"), 2) == ["b", "c"] and tail(str(tmp_path / "missing.log")) == []
