"""The CLI on real and damaged files: output, JSON, and one-line errors."""

import json
import os
import subprocess
import sys

import pytest

from allocscope.cli import main

from ..conftest import DATA

pytestmark = pytest.mark.torch_agnostic

FIXTURE = os.path.join(DATA, "cpu_train_v1.alsc")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "allocscope", *args], capture_output=True, text=True, timeout=120)


def test_info_text_and_json(capsys):
    assert main(["info", FIXTURE]) == 0
    text = capsys.readouterr().out
    assert "format 1, complete" in text and "alloc 204" in text and "stacks     python" in text
    assert main(["info", "--json", FIXTURE]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["events"]["alloc"] == 204 and info["events"]["mark"] == 2
    assert info["complete"] and info["metadata"]["devices_recorded"] == ["cpu"]
    assert info["event_bytes_per_event"] < info["bytes_per_event"]


def test_dump_text_json_filters_and_stacks(capsys):
    assert main(["dump", "--kind", "mark", "--stacks", FIXTURE]) == 0
    out = capsys.readouterr().out.splitlines()
    marks = [line for line in out if line.split()[:1] != [] and line.split()[0].isdigit() and " mark " in line]
    assert len(marks) == 2 and "label='step 0'" in marks[0]
    assert any("cpu_train (" in line and "make_fixtures.py" in line for line in out)
    assert main(["dump", "--json", "--limit", "3", FIXTURE]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["seq"] for r in rows] == [0, 1, 2] and rows[0]["kind"] == "alloc" and rows[0]["device"] == -1


@pytest.mark.parametrize("args, message", [
    (["info", "/nonexistent.alsc"], "cannot read"),
    (["dump", __file__], "not an allocscope capture"),
    (["run", "-o", "x.alsc"], "no command given"),
    (["run", "--gpu", "B200-192GB", "-o", "x.alsc", "--", "x.py"], "unknown GPU 'B200-192GB'"),
    (["run", "--no-record", "--", "x.py"], "--no-record runs on the virtual GPU"),
    (["run", "--gpu", "H100-80GB", "--gpu-memory", "lots", "-o", "x.alsc", "--", "x.py"], "not a size"),
    (["run", "--gpu", "H100-80GB", "--", "x.py"], "give the capture file"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr


def test_corrupt_file_is_one_line(tmp_path):
    data = bytearray(open(FIXTURE, "rb").read())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.alsc"
    bad.write_bytes(bytes(data))
    result = cli("info", str(bad))
    assert result.returncode == 2 and "checksum" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_wrong_arguments_exit_2():
    assert cli("dump", "--kind", "nonsense", FIXTURE).returncode == 2
    assert cli().returncode == 2
    assert cli("--version").stdout.startswith("allocscope ")
    for command in ("run", "info", "dump"):
        result = cli(command, "--help")
        assert result.returncode == 0 and "examples:" in result.stdout


def test_run_lists_the_virtual_gpus():
    from allocscope import vgpu

    if not vgpu.available():
        pytest.skip("built without the virtual GPU")
    result = cli("run", "--gpu", "list")
    assert result.returncode == 0
    for p in vgpu.presets():
        assert p.key in result.stdout and p.name in result.stdout


def test_a_closed_pipe_ends_quietly_as_other_unix_tools_do(tmp_path):
    """`allocscope dump FILE | head -1`: the pipeline succeeds, nothing reaches
    stderr, and allocscope's own status is what a Unix tool's is when its
    reader goes away (cat's in the same pipeline: killed by SIGPIPE, 141)."""
    # 960 KB of text, 15 times what a Linux pipe buffers: the writer cannot
    # finish before `head` goes away (a 10 KB dump could, and did in CI)
    big = os.path.join(DATA, "cuda_fragment_v1.alsc")
    script = (f"{sys.executable} -m allocscope dump {big} 2>{tmp_path}/err | head -1 >/dev/null; "
              f"echo ${{PIPESTATUS[0]}}; yes | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}")
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    ours, theirs = result.stdout.split()
    assert ours == theirs == "141"
    assert (tmp_path / "err").read_text() == ""
    assert subprocess.run(["bash", "-c", f"{sys.executable} -m allocscope dump {big} | head -1"],
                          capture_output=True, text=True, timeout=120).returncode == 0


def test_an_internal_error_keeps_its_traceback(monkeypatch, tmp_path):
    """Only bad input is a one-line error: a bug (here a ValueError and an
    OSError from inside a report) surfaces with its traceback."""
    import allocscope.reports.report as report

    def broken(*args, **kwargs):
        raise ValueError("a bug, not bad input")

    monkeypatch.setattr(report, "build_report", broken)
    with pytest.raises(ValueError, match="a bug"):
        main(["report", FIXTURE])

    def unreadable(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "/somewhere/allocscope/itself/reads")

    monkeypatch.setattr(report, "build_report", unreadable)
    with pytest.raises(FileNotFoundError):
        main(["report", FIXTURE])
    # in a process of its own: the traceback is printed, the status is Python's for an uncaught exception
    code = (f"import sys, allocscope.reports.report as r\n"
            f"r.build_report = lambda *a, **k: {{}}['a bug']\n"
            f"from allocscope.cli import main\nsys.exit(main(['report', {FIXTURE!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback (most recent call last)" in result.stderr
    assert "KeyError: 'a bug'" in result.stderr


def test_an_os_error_on_a_path_the_user_named_is_bad_input(tmp_path, capsys):
    out = tmp_path / "missing-folder" / "report.html"
    assert main(["html", FIXTURE, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("allocscope html: error: ") and str(out) in err[0]
