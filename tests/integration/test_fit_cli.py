"""allocscope fit: one command on several virtual cards. Its verdicts and
peaks are those of torch's real allocator in the same runs (the script
reports torch.cuda.max_memory_reserved()); a card too small comes with the
post-mortem; a command that fails for another reason is not called out of
memory; bad input is a one-line error."""

import json
import os
import subprocess
import sys

import pytest

import allocscope
from allocscope.reports.fit import caveats, render_fit, render_search

pytestmark = [pytest.mark.torch_agnostic,
              pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")]

SCRIPT = """\
import json, os, sys, torch
gib = int(sys.argv[1])
x = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
y = torch.empty(1 << 20, device="cuda")
if len(sys.argv) > 2:
    raise SystemExit(sys.argv[2])
with open(os.environ["FIT_TRUTH"], "a") as f:
    f.write(json.dumps({"gpu": torch.cuda.get_device_name(), "max_reserved": torch.cuda.max_memory_reserved(),
                        "max_allocated": torch.cuda.max_memory_allocated()}) + "\\n")
"""


def fit(tmp_path, *args, **environment):
    env = dict(os.environ, FIT_TRUTH=str(tmp_path / "truth.jsonl"), **environment)
    return subprocess.run([sys.executable, "-m", "allocscope", "fit", *args], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env=env)


TRY = """\
import json, sys, torch
fits = []
for gib in map(int, sys.argv[1:]):  # what SCRIPT allocates, each from an empty allocator (as a new process's)
    try:
        x = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
        y = torch.empty(1 << 20, device="cuda")
        fits.append(True)
    except torch.cuda.OutOfMemoryError:
        fits.append(False)
    x = y = None
    torch.cuda.empty_cache()
print(json.dumps(fits))
"""


def allocator_says(tmp_path, gpu: str, values: list[int]) -> list[bool]:
    """Whether SCRIPT fits at each value, from torch's allocator on the card
    itself, unrecorded: the truth a search's answer is held to (one process)."""
    (tmp_path / "try.py").write_text(TRY)
    r = subprocess.run([sys.executable, "-m", "allocscope", "run", "--gpu", gpu, "--no-record", "--",
                        str(tmp_path / "try.py"), *map(str, values)], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-500:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "big.py"
    path.write_text(SCRIPT)
    return str(path)


@pytest.fixture(scope="module")
def a100_and_l4(tmp_path_factory):
    """One fit, two tests: 30 GiB has room on a 40 GB A100, none on a 24 GB L4."""
    tmp_path = tmp_path_factory.mktemp("a100_and_l4")
    (tmp_path / "big.py").write_text(SCRIPT)
    return tmp_path, str(tmp_path / "big.py"), fit(tmp_path, "--gpu", "A100-40GB", "--gpu", "L4-24GB", "--json", "--",
                                                   str(tmp_path / "big.py"), "30")


def test_fits_on_one_card_and_not_on_another(a100_and_l4):
    tmp_path, script, result = a100_and_l4
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "allocscope.fit/1" and not doc["fits_everywhere"]
    a100, l4 = doc["cards"]
    truth = [json.loads(line) for line in (tmp_path / "truth.jsonl").read_text().splitlines()]
    assert len(truth) == 1 and "A100" in truth[0]["gpu"]  # the L4 run died at its first allocation
    assert a100["verdict"] == "fits" and a100["exit_status"] == 0 and a100["ooms"] == 0
    assert a100["peak_reserved_bytes"] == truth[0]["max_reserved"]
    assert a100["peak_allocated_bytes"] == truth[0]["max_allocated"]
    assert a100["headroom_bytes"] == a100["total_bytes"] - a100["peak_reserved_bytes"] - a100["outside_allocator_bytes"]
    assert 0 < a100["headroom_bytes"] < 10 << 30
    assert a100["peak"]["sites"][0]["site"].startswith(f"{script}:3")
    assert l4["verdict"] == "out of memory" and l4["exit_status"] == 1 and l4["headroom_bytes"] is None
    assert l4["oom"]["request"]["size"] == 30 << 30
    assert l4["shortfall_bytes"] == l4["oom"]["shortfall"] > 0
    # the captures are kept for report / html / simulate; their HTML opens with fit's verdict
    from allocscope.reports.html import html_data

    for card in doc["cards"]:
        cap = allocscope.load(tmp_path / card["capture"])
        assert cap.metadata["virtual_gpu"]["spec"] == card["gpu"]
        assert cap.metadata["fit"]["gpu"] == card["gpu"] and cap.metadata["fit"]["command"][-1] == "30"
        shown = html_data(cap)["fit"]
        assert shown["gpu"] == card["gpu"] and shown["verdict"] == card["verdict"]
        assert (shown["peak_reserved_bytes"], shown["shortfall_bytes"]) == (card["peak_reserved_bytes"],
                                                                          card["shortfall_bytes"])


def test_the_text_shows_each_verdict_and_the_post_mortem(a100_and_l4):
    # The text is the JSON document rendered (test_a_command_that_never_uses_cuda_... holds the command line to
    # it; a fit where every card fits exits 0: test_the_python_api_returns_the_document_fit_json_prints).
    _, _, result = a100_and_l4
    out = render_fit(json.loads(result.stdout))
    assert "A100-40GB  fits" in out and "L4-24GB    out of memory" in out
    assert "Out of memory at event" in out and "requested 30.00 GiB" in out and "short by" in out
    # what the dry run's numbers assume about values (docs/vgpu.md, "Values")
    assert "values computed on the virtual GPU: values; MoE routing where a router's logits were not computed: " \
           "balanced" in out.splitlines()[1]


def test_a_command_that_fails_otherwise_is_not_out_of_memory(tmp_path, script):
    result = fit(tmp_path, "--gpu", "L4-24GB", "--json", "--", script, "1", "boom")
    assert result.returncode == 1
    card = json.loads(result.stdout)["cards"][0]
    assert card["verdict"] == "failed" and card["exit_status"] == 1 and card["ooms"] == 0
    assert card["peak_reserved_bytes"] >= 1 << 30 and "oom" not in card
    text = render_fit(json.loads(result.stdout))
    assert "failed (exit 1)" in text and "says nothing about memory" in text


@pytest.mark.parametrize("args,message", [
    (["--gpu", "B200-999GB", "--", "x.py"], "unknown GPU 'B200-999GB'"),
    (["--gpu", "L4-24GB"], "no command given"),
    (["--gpu", "L4-24GB", "--top", "0", "--", "x.py"], "--top must be at least 1"),
])
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    result = fit(tmp_path, *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "allocscope-fit").exists() or not os.listdir(tmp_path / "allocscope-fit")


def test_existing_captures_need_force(tmp_path, script):
    (tmp_path / "allocscope-fit").mkdir()
    (tmp_path / "allocscope-fit" / "L4-24GB.alsc").write_bytes(b"old")
    result = fit(tmp_path, "--gpu", "L4-24GB", "--", script, "1")
    assert result.returncode == 2 and "use --force" in result.stderr
    assert (tmp_path / "allocscope-fit" / "L4-24GB.alsc").read_bytes() == b"old"


def test_search_finds_the_largest_value_that_fits_in_fewer_runs(tmp_path, script):
    values = range(18, 25)
    # the value through the placeholder
    result = fit(tmp_path, "--gpu", "L4-24GB", "--search", f"GIB={values[0]}..{values[-1]}", "--json", "--",
                 script, "{GIB}")
    assert result.returncode == 0, result.stderr
    card = json.loads(result.stdout)["cards"][0]
    expected = card["largest"]
    assert values[0] <= expected < values[-1] and card["runs"] < len(values)
    # The truth from the allocator itself (no recording): the script allocates GIB GiB, so the largest value
    # that fits is the one that fits while the next does not.
    assert allocator_says(tmp_path, "L4-24GB", [expected, expected + 1]) == [True, False]
    assert card["at_largest"]["verdict"] == "fits" and card["at_largest"]["value"] == expected
    assert card["at_next"]["verdict"] == "out of memory" and card["at_next"]["value"] == expected + 1
    assert card["at_largest"]["peak_reserved_bytes"] >= expected << 30
    assert os.path.exists(tmp_path / card["at_largest"]["capture"])
    # (the value through the environment variable: test_a_search_states_memory_as_a_fixed_and_a_per_unit_part)
    # Quiet: one line per run on stderr (and one naming where the logs go); each run's own output, the
    # traceback of its out-of-memory error included, in a log beside its capture.
    lines = result.stderr.splitlines()
    assert "Traceback" not in result.stderr and len(lines) <= card["runs"] + 2, result.stderr
    assert sum(f"GIB={v} " in line and "out of memory, short by" in line for line in lines for v in values) >= 1
    assert f"GIB={expected} " in result.stderr and "fits, peak reserved" in result.stderr
    oom_log = tmp_path / "allocscope-fit" / f"L4-24GB.GIB={expected + 1}.log"
    assert "OutOfMemoryError" in oom_log.read_text()


def test_a_smaller_card_of_the_same_chip_is_searched_by_replays(tmp_path, script):
    # A100 80 GB and 40 GB: the same chip, so the 80 GB card's runs, replayed with 40 GB, answer those
    # values on the 40 GB card; its own runs go to what they leave open: here only its answer.
    result = fit(tmp_path, "--gpu", "A100-40GB", "--gpu", "A100-80GB", "--search", "GIB=20..70", "--json", "--",
                 script, "{GIB}")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    small, large = doc["cards"]  # in the order asked
    assert (small["gpu"], large["gpu"]) == ("A100-40GB", "A100-80GB")
    assert large["replayed"] == [] and small["replayed"] and small["confirmed"]
    assert large["runs"] <= 6  # at most bisection's ceil(log2(51 + 2)): the memory measured guides it
    assert small["runs"] <= 2 and sorted(small["tried"]) == [small["largest"], small["largest"] + 1]
    # The answer is the real allocator's: the largest value fits on the card, the next does not.
    assert allocator_says(tmp_path, "A100-40GB", [small["largest"], small["largest"] + 1]) == [True, False]
    text = render_search(doc)
    assert f"{small['runs']} (+{len(small['replayed'])} replayed)" in text
    assert "Replayed: values answered by replaying" in text


def test_a_search_stops_where_the_command_fails_otherwise(tmp_path, script):
    result = fit(tmp_path, "--gpu", "L4-24GB", "--search", "GIB=1..4", "--", script, "{GIB}", "boom")
    assert result.returncode == 2 and "failed (exit status 1) without running out of memory" in result.stderr
    assert "Traceback (most recent call last)" not in result.stderr.split("allocscope fit: error:")[-1]
    # the failing run's last lines (its SystemExit message) and where the rest is
    (log,) = (tmp_path / "allocscope-fit").glob("L4-24GB.GIB=*.log")
    assert "    | boom" in result.stderr and f"all of it: {os.path.join('allocscope-fit', log.name)}" in result.stderr


def test_a_script_that_does_not_parse_shows_its_error_and_its_log(tmp_path):
    (tmp_path / "typo.py").write_text("import torch\ndef f(:\n")
    result = fit(tmp_path, "--gpu", "L4-24GB", "--search", "N=1..8", "--", str(tmp_path / "typo.py"), "{N}")
    assert result.returncode == 2 and "failed (exit status 1) without running out of memory" in result.stderr
    assert "| SyntaxError: invalid syntax" in result.stderr and "all of it: allocscope-fit" in result.stderr
    assert "failed (exit status 1), no capture" in result.stderr


def test_verbose_shows_each_runs_own_output(tmp_path, script):
    result = fit(tmp_path, "--gpu", "L4-24GB", "--verbose", "--", script, "30")
    assert result.returncode == 1
    assert "running a virtual L4-24GB" in result.stderr and "OutOfMemoryError" in result.stderr
    assert not list((tmp_path / "allocscope-fit").glob("*.log"))


@pytest.mark.parametrize("spec,message", [("BATCH", "is not NAME=LOW..HIGH"), ("BATCH=1-4", "is not NAME=LOW..HIGH"),
                                          ("BATCH=a..4", "must be integers"), ("BATCH=9..4", "must not be above"),
                                          ("1X=1..2", "is not NAME=LOW..HIGH")])
def test_a_malformed_range_is_a_one_line_error(tmp_path, spec, message):
    result = fit(tmp_path, "--gpu", "L4-24GB", "--search", spec, "--", "x.py")
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_a_watched_model_gets_its_categories_and_the_textbook_estimate(tmp_path, script):
    train = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train.py")
    result = fit(tmp_path, "--gpu", "T4-16GB", "--json", "--", train, "--steps", "2")
    assert result.returncode == 0, result.stderr
    card = json.loads(result.stdout)["cards"][0]
    assert card["watched"] and card["peak"]["by_category"]["activation"] > 0
    est = card["estimate"]
    # the waterfall adds up: the estimate plus each item of the difference is the measured figure
    assert est["textbook_bytes"] > 0 and est["basis"] == "device_used"
    assert est["textbook_bytes"] + sum(g["bytes"] for g in est["gap"]) == est["measured_bytes"]
    assert any(g["item"] == "outside_allocator" for g in est["gap"])
    text = render_fit(json.loads(result.stdout))
    assert "the textbook estimate against the measured peak:" in text and "= measured" in text
    # a script without a model has no estimate to give
    unwatched = json.loads(fit(tmp_path, "-f", "--gpu", "T4-16GB", "--json", "--", script, "1").stdout)
    assert unwatched["cards"][0]["estimate"] is None and unwatched["cards"][0]["watched"] == []


UNWATCHED = """import torch
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.randn(256, 1024, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_model_the_script_does_not_watch_is_watched_for_it(tmp_path):
    path = tmp_path / "unwatched.py"
    path.write_text(UNWATCHED)
    result = fit(tmp_path, "--gpu", "L4-24GB", "--json", "--", str(path))
    assert result.returncode == 0, result.stderr
    card = json.loads(result.stdout)["cards"][0]
    assert card["watched"] == ["Sequential"]
    params = (1024 * 4096 + 4096 + 4096 * 10 + 10) * 4
    assert card["estimate"]["theory"]["parameters"] == params
    assert card["estimate"]["theory"]["optimizer_state"] == 2 * params  # AdamW, found at its first step
    assert card["peak"]["by_category"]["parameter"] == params
    assert card["peak"]["module_classes"]["Sequential.0"] == "Linear"
    assert card["caveats"] == []  # linear layers: nothing the virtual GPU leaves out


CONV = """\
import torch
conv = torch.nn.Conv2d(3, 8, 3).cuda()
conv(torch.randn(2, 3, 32, 32, device="cuda")).sum().backward()
"""


def test_convolutions_come_with_the_cudnn_caveat_where_no_table_covers_the_card(tmp_path):
    # cuDNN runs on the virtual GPU, its workspaces from tables recorded on
    # cards: a card the tables do not cover gets a caveat, one they cover none
    path = tmp_path / "conv.py"
    path.write_text(CONV)
    result = fit(tmp_path, "--gpu", "L4-24GB", "--json", "--", str(path))
    assert result.returncode == 0, result.stderr
    (caveat,) = json.loads(result.stdout)["cards"][0]["caveats"]
    assert "hold none for NVIDIA L4" in caveat
    assert f"caveat: {caveat}" in render_fit(json.loads(result.stdout))
    # the same capture, had the tables held rows for the card: no caveat
    cap = allocscope.load(tmp_path / "allocscope-fit" / "L4-24GB.alsc")
    assert cap.metadata["virtual_gpu"]["cudnn"]["table_rows"].get("NVIDIA L4") is None
    assert caveats(cap) == [caveat]
    cap.metadata["virtual_gpu"]["cudnn"]["table_rows"]["NVIDIA L4"] = 1
    assert caveats(cap) == []


def test_a_command_that_never_uses_cuda_has_no_verdict_on_memory(tmp_path):
    quiet = tmp_path / "quiet.py"
    quiet.write_text("print('no torch here')\n")
    result = fit(tmp_path, "--gpu", "L4-24GB", "--json", "--", str(quiet))
    assert result.returncode == 1 and "no torch here" in result.stderr  # the command's output, kept off the JSON
    doc = json.loads(result.stdout)
    assert doc["cards"] == [{"gpu": "L4-24GB", "exit_status": 0, "capture": None, "verdict": "no capture"}]
    text = fit(tmp_path, "--gpu", "L4-24GB", "--", str(quiet)).stdout
    assert "no capture was written: the command never used CUDA" in text
    # the command line's text is the document rendered (the other tests render their JSON)
    assert text.endswith(render_fit(doc) + "\n")


def _without_addresses(value):
    """A document less the virtual GPU's addresses, which differ from run to run."""
    if isinstance(value, dict):
        return {k: _without_addresses(v) for k, v in value.items() if k != "address"}
    if isinstance(value, list):
        return [_without_addresses(v) for v in value]
    return value


def test_the_python_api_returns_the_document_fit_json_prints(tmp_path, script, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FIT_TRUTH", str(tmp_path / "truth.jsonl"))
    # The interpreter named (not implied for the script): the same command line both ways.
    doc = allocscope.fit([sys.executable, script, "1"], ["L4-24GB"], output_dir="api", stdout_to_stderr=True)
    result = fit(tmp_path, "--gpu", "L4-24GB", "-o", "api", "-f", "--json", "--", sys.executable, script, "1")
    assert result.returncode == 0, result.stderr
    assert _without_addresses(doc) == _without_addresses(json.loads(result.stdout))
    assert doc["cards"][0]["verdict"] == "fits" and doc["cards"][0]["capture"] == os.path.join("api", "L4-24GB.alsc")
    # bad input is an InputError, as the command line's one-line errors are
    with pytest.raises(allocscope.InputError, match="exists; use --force"):
        allocscope.fit([script, "1"], ["L4-24GB"], output_dir="api")
    with pytest.raises(allocscope.InputError, match="unknown GPU"):
        allocscope.fit([script, "1"], ["B200-999GB"])
    with pytest.raises(allocscope.InputError, match="is not NAME=LOW..HIGH"):
        allocscope.fit([script, "{N}"], ["L4-24GB"], search="N=1-2")


def test_gpu_memory_gives_every_card_that_memory_but_a_card_s_own(tmp_path, script):
    """--gpu-memory: the cards torch sees have the memory given, but one given
    its own (GPU:SIZE), and the verdicts follow it: 13 GiB fits on a 40 GB
    A100 and on a 24 GB L4, not in 12 GiB; on the L4 given 20 GiB, it does."""
    result = fit(tmp_path, "--gpu", "A100-40GB", "--gpu", "L4-24GB:20GiB", "--gpu-memory", "12GiB", "--json", "--",
                 script, "13")
    assert result.returncode == 1, result.stderr
    cards = json.loads(result.stdout)["cards"]
    assert [c["gpu"] for c in cards] == ["A100-40GB", "L4-24GB:20GiB"]
    assert [c["verdict"] for c in cards] == ["out of memory", "fits"]
    assert [c["total_bytes"] for c in cards] == [12 << 30, 20 << 30]
    assert cards[1]["capture"] == os.path.join("allocscope-fit", "L4-24GB-20GiB.alsc")


def test_a_mig_slice_is_the_card_its_profile_makes(tmp_path, script):
    """A MIG preset: the device torch sees inside the slice (its name, memory
    and SMs), and fit's verdict on it: 5 GiB does not fit in an A100 40GB's
    1g.5gb (4.75 GiB) though it would on the whole card."""
    from allocscope import vgpu

    (mig,) = vgpu.parse_gpus("A100-40GB-MIG-1g.5gb")
    result = fit(tmp_path, "--gpu", mig.key, "--json", "--", script, "5")
    assert result.returncode == 1, result.stderr
    (card,) = json.loads(result.stdout)["cards"]
    assert card["verdict"] == "out of memory" and card["total_bytes"] == mig.total_memory == 4864 << 20
    cap = allocscope.load(tmp_path / card["capture"])
    (device,) = cap.metadata["cuda_devices"]
    assert device["name"] == "NVIDIA A100-SXM4-40GB MIG 1g.5gb" and device["total_memory"] == 4864 << 20
    assert device["multi_processor_count"] == 14


MLP = """\
import os, torch
B = int(os.environ["B"])  # the searched value through the environment (not a {B} in the command)
D, H, C = 256, 512, 10
model = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.ReLU(), torch.nn.Linear(H, C)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(B, D, device="cuda")
y = torch.randint(0, C, (B,), device="cuda")
for _ in range(2):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
"""


def test_a_search_states_memory_as_a_fixed_and_a_per_unit_part(tmp_path):
    """From the runs a search makes (the value reaching the script through
    the environment variable B), memory against the value: on an MLP with
    Adam whose parts follow from its shapes, parameters, gradients and
    optimizer state are fixed to the byte, the input grows by B x D x 4 bytes,
    the labels by 8 bytes a sample; the parts sum to what each run measured;
    and the largest growing request's 10 MiB class is placed on its line."""
    D, H, C = 256, 512, 10
    (tmp_path / "mlp.py").write_text(MLP)
    doc = allocscope.fit([str(tmp_path / "mlp.py")], ["H100-80GB"], output_dir=str(tmp_path / "out"),
                         search="B=512..8192")
    (card,) = doc["cards"]
    m = card["memory"]
    assert card["largest"] == 8192 and len(m["values"]) >= 2 and m["values"] == sorted(card["tried"])
    params = (D * H + H + H * C + C) * 4
    parts = m["parts"]
    for part, fixed in (("parameter", params), ("gradient", params), ("optimizer_state", 2 * params)):
        assert parts[part]["fixed_bytes"] == fixed and abs(parts[part]["per_unit_bytes"]) < 1e-6, part
    assert parts["input"]["fixed_bytes"] == 0 and parts["input"]["per_unit_bytes"] == pytest.approx(D * 4)
    assert parts["other"]["per_unit_bytes"] == pytest.approx(8)  # the int64 labels, outside the model
    assert parts["outside_allocator"]["fixed_bytes"] == 512 << 20  # the CUDA context
    for i in range(len(m["values"])):  # the parts add up to each run's measured memory
        assert sum(p["at_values"][i] for p in parts.values()) == m["measured_bytes"][i]
    at = card["at_largest"]  # measured: the card's memory at the peak, the reserved peak and the context
    assert m["measured_bytes"][-1] == at["peak_reserved_bytes"] + at["outside_allocator_bytes"]
    assert abs(m["fixed_bytes"] + m["per_unit_bytes"] * 8192 - m["measured_bytes"][-1]) <= m["residual_bytes"] + 1
    # the largest growing request is a tensor of the batch's shape: it reaches 10 MiB (a segment of its own)
    # at the first B whose request is that large
    per_sample, rest = divmod(at["largest_growing_request_bytes"], 8192)
    assert rest == 0 and per_sample > 0
    (change,) = [c for c in m["changes"] if c["request_bytes"] == 10 << 20]
    assert change["value"] == -(-(10 << 20) // per_sample)
    text = render_search(doc)
    assert "per B" in text and "input 1.00 KiB" in text and f"from B={change['value']}" in text


def test_gpu_memory_defaults_to_the_environment_s_and_a_bad_size_is_one_line(tmp_path, monkeypatch, capsys):
    import allocscope.harness.fit as harness
    from allocscope.cli import main

    asked = {}
    monkeypatch.setattr(harness, "fit", lambda *a, **kw: asked.update(kw) or {"fits_everywhere": True, "cards": []})
    monkeypatch.setattr("allocscope.reports.fit.render_fit", lambda doc, top, stacks="folded": "")
    monkeypatch.setenv("ALLOCSCOPE_VGPU_MEMORY", "12GiB")
    assert main(["fit", "--gpu", "A100-40GB", "--", "train.py"]) == 0 and asked["gpu_memory"] == "12GiB"
    assert main(["fit", "--gpu", "A100-40GB", "--gpu-memory", "20GiB", "--", "train.py"]) == 0
    assert asked["gpu_memory"] == "20GiB"  # the option over the environment
    monkeypatch.undo()
    assert main(["fit", "--gpu", "A100-40GB", "--gpu-memory", "lots", "-o", str(tmp_path), "--", "train.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lots" in err[0]
