"""The CLI on real and damaged files: output, JSON, and one-line errors."""

import json
import os
import subprocess
import sys

import pytest

from allocscope.cli import main

from ..conftest import DATA

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
