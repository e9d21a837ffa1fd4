"""The notebook integration (allocscope.harness.notebook) in a real IPython shell:
the InteractiveShell that Jupyter's IPython kernel runs cells in, in a
process of its own, with IPython's own capture of what a cell displays.
`%load_ext allocscope`, then `%%allocscope` records the cell and shows the
page of `allocscope html` inline; a cell that runs out of memory still shows
its report, then raises; bad options are one line. IPython is an optional
dependency: make test installs it, and CI fails without it."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

import allocscope

pytestmark = pytest.mark.torch_agnostic


@pytest.fixture(scope="module", autouse=True)
def ipython():
    try:
        import IPython  # noqa: F401
    except ImportError:
        why = "IPython is not installed (an optional dependency: pip install ipython; make test installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def in_ipython(tmp_path, cells: list[str]) -> list[dict]:
    """Runs cells in a fresh IPython shell; per cell: its error (type name),
    what it printed, and the MIME types and HTML it displayed."""
    script = textwrap.dedent("""
        import json, sys
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
        shell = InteractiveShell.instance()
        out = []
        for cell in json.loads(sys.argv[1]):
            with capture_output() as io:
                r = shell.run_cell(cell)
            err = r.error_in_exec or r.error_before_exec
            out.append({"error": type(err).__name__ if err else None, "stdout": io.stdout,
                        "displayed": [sorted(o.data) for o in io.outputs],
                        "html": "".join(o.data.get("text/html", "") for o in io.outputs)})
        print("\\nRESULT " + json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", script, json.dumps(cells)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.split("\nRESULT ", 1)[1])


def test_a_recorded_cell_shows_its_report_inline(tmp_path):
    cap = tmp_path / "cell.alsc"
    load, setup, recorded, bad, shown, missing, fails, no_mark = in_ipython(tmp_path, [
        "%load_ext allocscope",
        "import torch\nmodel = torch.nn.Linear(64, 32)\nopt = torch.optim.Adam(model.parameters())",
        f"%%allocscope -o {cap}\nmodel(torch.randn(16, 64)).sum().backward()\nopt.step()",
        "%%allocscope --devise cpu\nx = 1",
        f"%allocscope {cap}",
        "%allocscope no-such.alsc",
        "%%allocscope --text\nmodel(torch.randn(8, 64)).sum().backward()\nraise RuntimeError('boom')",
        "%%allocscope --at 'no such mark'\nx = torch.ones(4)",
    ])
    assert load["error"] is None and setup["error"] is None
    assert recorded["error"] is None and f"recorded the cell on cpu into {cap}" in recorded["stdout"]
    assert recorded["displayed"] == [["text/html", "text/plain"]]
    page = recorded["html"]
    assert page.startswith("<iframe srcdoc=") and "width:100%" in page and "allocscope report" in page
    assert "&lt;script&gt;" in page and "<script>" not in page  # the page is inside the frame, escaped
    # the capture: the cell's model watched without a watch() call, its parameters and Adam state exact
    from allocscope.reports.report import build_report

    c = allocscope.load(cap)
    report = build_report(c)
    assert c.complete and report["capture"]["watched"] == ["Linear"]
    by_category = report["peak"]["by_category"]
    params = (64 * 32 + 32) * 4
    # Adam: exp_avg and exp_avg_sq, and a 4-byte step tensor for each of the 2 parameters (on the CPU)
    assert by_category["parameter"] == params and by_category["optimizer_state"] == 2 * params + 2 * 4
    # bad options, a missing file: one line, no traceback
    assert bad["error"] is None and bad["stdout"].strip().count("\n") == 0 and "--devise" in bad["stdout"]
    assert shown["html"].startswith("<iframe srcdoc=") and missing["error"] is None
    assert missing["stdout"].startswith("allocscope: ") and missing["stdout"].strip().count("\n") == 0
    # a cell that raises: its report (here the text one) first, then the cell's own error
    assert fails["error"] == "RuntimeError" and "at the peak of allocated memory" in fails["stdout"]
    # a report that cannot be made (--at a mark the cell never made): one line after the recording
    assert no_mark["error"] is None and no_mark["stdout"].splitlines()[-1].startswith("allocscope: ")
    assert "no such mark" in no_mark["stdout"]
    written = fails["stdout"].split(" into ", 1)[1].splitlines()[0]
    assert allocscope.load(written).metadata.get("devices_recorded") == ["cpu"]


@pytest.mark.cuda
def test_an_out_of_memory_cell_on_cuda_shows_its_report_then_raises(tmp_path):
    import torch

    if not allocscope.vgpu.active():
        pytest.skip("allocates the whole card: on the virtual GPU only")
    total = torch.cuda.get_device_properties(0).total_memory
    _, oom, text = in_ipython(tmp_path, [
        "%load_ext allocscope",
        f"%%allocscope -o {tmp_path / 'oom.alsc'}\nimport torch\n"
        f"x = torch.empty({total}, dtype=torch.uint8, device='cuda')",
        f"%%allocscope --text -o {tmp_path / 'oom-text.alsc'}\nimport torch\n"
        f"y = torch.ones(4, device='cuda')\nx = torch.empty({total}, dtype=torch.uint8, device='cuda')",
    ])
    assert oom["error"] == "OutOfMemoryError" and "recorded the cell on cuda" in oom["stdout"]
    assert oom["html"].startswith("<iframe srcdoc=")
    # as text, the post-mortem's stack starts at the cell's own line; IPython's frames fold into one line each run
    assert text["error"] == "OutOfMemoryError" and "Out of memory at event" in text["stdout"], text["stdout"]
    stack = text["stdout"].split(" stack ", 1)[1].splitlines()
    assert stack[0].strip() == "<module> (<allocscope cell>:3)", stack  # the cell's third line
    assert any(re.fullmatch(r" *\[\+\d+ IPython frames?\]", line) for line in stack), stack
    c = allocscope.load(tmp_path / "oom.alsc")
    assert int((c.events.kind == allocscope.EventKind.OOM).sum()) == 1


def test_the_fit_document_shows_as_its_text_in_a_notebook():
    from allocscope.reports.fit import FitDocument, fit_document, render_fit

    card = {"gpu": "L4-24GB", "exit_status": 0, "capture": None, "verdict": "no capture"}
    doc = fit_document(["python", "train.py"], [card])
    assert isinstance(doc, FitDocument) and json.loads(json.dumps(doc)) == dict(doc)
    shown = doc._repr_html_()
    assert shown.startswith("<pre>") and "allocscope fit: python train.py" in shown
    assert render_fit(doc).splitlines()[0] in shown
