"""examples/real_models.py and model_zoo.py: the plain-PyTorch models have
their published parameter counts, and a dry run on the virtual GPU trains
each for a step with the memory it needs (parameters, gradients and AdamW's
two states at least; checkpointing needs less)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import allocscope

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import model_zoo  # noqa: E402

pytestmark = pytest.mark.torch_agnostic


@pytest.mark.parametrize("name", model_zoo.MODELS)
def test_plain_models_have_their_published_parameter_counts(name):
    with torch.device("meta"):
        model, _, _ = model_zoo.build(name, "plain")
    assert model_zoo.parameters(model) == model_zoo.ABOUT[name][1]


def dry_run(*args):
    if not allocscope.vgpu.available():
        pytest.skip("built without the virtual GPU")
    env = allocscope.vgpu.environment("H100-80GB", base={k: v for k, v in os.environ.items()
                                                          if not k.startswith("ALLOCSCOPE_")})
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "real_models.py"), *args, "--impl", "plain",
                          "--steps", "1", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name,args", [("gpt2", ["--seq", "256"]), ("bert", ["--seq", "128"]),
                                       ("resnet50", ["--batch-size", "4"]), ("llama", ["--seq", "128"]),
                                       # the other convolution nets: make test-full (make test's time budget)
                                       pytest.param("convnext", ["--batch-size", "4"], marks=pytest.mark.heavy),
                                       pytest.param("unet", ["--batch-size", "2"], marks=pytest.mark.heavy)])
def test_a_dry_run_trains_each_model(name, args):
    r = dry_run(name, *args)
    assert r["parameters"] == model_zoo.ABOUT[name][1]
    # fp32 parameters, gradients and AdamW's two states: 16 bytes a parameter, live together after the step
    assert r["max_memory_allocated"] >= 16 * r["parameters"]
    assert r["max_memory_reserved"] >= r["max_memory_allocated"]


def test_checkpointing_and_accumulation_need_less():
    full = dry_run("gpt2", "--batch-size", "8")
    assert dry_run("gpt2", "--batch-size", "8", "--checkpoint")["max_memory_reserved"] < full["max_memory_reserved"]
    assert (dry_run("gpt2", "--batch-size", "2", "--accumulate", "4")["max_memory_reserved"]
            < full["max_memory_reserved"])
