"""allocscope diff on real CPU recordings of one script at two batch sizes:
activations and inputs scale with the batch, parameters, gradients and
optimizer state do not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch_agnostic

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "train_batch.py")


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    out = []
    for batch in (32, 64):
        path = str(d / f"bs{batch}.alsc")
        r = subprocess.run([sys.executable, "-m", "allocscope", "run", "--device", "cpu", "-o", path, "--", sys.executable, SCRIPT,
                            str(batch)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        out.append(path)
    return out


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "allocscope", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def test_diff_shows_activations_scaling_with_the_batch_and_parameters_unchanged(captures):
    r = cli("diff", *captures, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    own = {row["name"]: row for row in d["category_peaks"]}
    for fixed in ("parameter", "gradient", "optimizer_state"):
        assert own[fixed]["a"] > 0 and own[fixed]["delta"] == 0, own[fixed]
    assert 1.9 <= own["activation"]["ratio"] <= 2.0
    assert own["input"]["ratio"] == 2.0
    peak = {row["name"]: row for row in d["peaks"]}["peak_allocated"]
    # The overall peak may sit in the optimizer step (Adam's temporaries do not
    # scale with the batch): it grows by at most what scales.
    assert 0 <= peak["delta"] <= own["activation"]["delta"] + own["input"]["delta"] + own["temporary"]["delta"]
    # The estimate grows only by its activation and input terms.
    assert {row["name"]: row for row in d["peaks"]}["estimate"]["delta"] > 0
    text = cli("diff", *captures)
    assert text.returncode == 0 and "activation" in text.stdout and "x2.00" in text.stdout


def test_diff_html_is_one_static_page(captures, tmp_path):
    r = cli("diff", *captures, "--html", "-o", str(tmp_path / "d.html"))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "d.html").read_text()
    assert "<script" not in page and "http" not in page.split("</style>")[1]
    assert page.count("<section") == 6 and "activation" in page
    again = cli("diff", *captures, "--html", "-o", str(tmp_path / "d.html"))
    assert again.returncode == 2 and "exists" in again.stderr


def test_html_names_its_output_after_the_input(captures, tmp_path):
    src = captures[0]
    r = cli("html", src, "--no-progress")
    assert r.returncode == 0, r.stderr
    out = os.path.splitext(src)[0] + ".html"
    assert os.path.getsize(out) > 10_000 and out in r.stdout
    assert cli("html", src).returncode == 2  # exists: needs -f
    assert cli("html", src, "-f", "--at", "no-such-mark").returncode == 2
