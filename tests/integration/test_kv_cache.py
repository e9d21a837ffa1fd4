"""Generation's KV cache named as such (attribution/kv_cache.py): Hugging
Face generate() with a static and a dynamic cache (examples/generate.py, a
Llama-style model from its config) on a virtual L4, its bytes against the
textbook formula, 2 x layers x key/value heads x head dim x bytes a token."""

import json
import subprocess
import sys

import pytest

import allocscope
from allocscope.attribution import CATEGORIES, attribute

from ..conftest import ROOT

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")]

GENERATE = f"{ROOT}/examples/generate.py"
LAYERS, KV_HEADS, HEAD_DIM, BATCH, PROMPT, NEW = 4, 2, 64, 4, 128, 16
PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2  # bfloat16


def report(tmp_path, cache):
    pytest.importorskip("transformers")
    out = tmp_path / f"{cache}.alsc"
    run = subprocess.run([sys.executable, "-m", "allocscope", "run", "--gpu", "L4-24GB", "--watch", "-o", str(out),
                          "--", sys.executable, GENERATE, "--layers", str(LAYERS), "--hidden", str(8 * HEAD_DIM),
                          "--intermediate", "1024", "--heads", "8", "--kv-heads", str(KV_HEADS), "--batch-size",
                          str(BATCH), "--prompt-len", str(PROMPT), "--max-new-tokens", str(NEW), "--cache", cache],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    said = json.loads(run.stdout.strip().splitlines()[-1])
    assert said["new_tokens"] == NEW
    doc = subprocess.run([sys.executable, "-m", "allocscope", "report", "--json", str(out)], capture_output=True,
                         text=True, timeout=600)
    assert doc.returncode == 0, doc.stderr[-3000:]
    return json.loads(doc.stdout), out


def test_a_static_cache_is_the_formula_for_every_position_it_holds(tmp_path):
    doc, _ = report(tmp_path, "static")
    kv = doc["kv_cache"]
    assert kv["shape"] == {"layers": LAYERS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "bytes_per_element": 2,
                           "bytes_per_token": PER_TOKEN}
    # allocated whole at the first step: the prompt and every new token but
    # the last (which is never fed back), for each sequence of the batch
    tokens = BATCH * (PROMPT + NEW - 1)
    assert kv["most_tokens"] == tokens and kv["tokens"] == tokens
    # beside the keys and values, only the layers' position counters (8 B each)
    assert kv["most_bytes"] == tokens * PER_TOKEN + 8 * LAYERS
    assert doc["peak"]["by_category"]["kv_cache"] == kv["bytes"]
    # the estimate's KV cache is the formula for the tokens generate() asked;
    # the waterfall's kv_cache line is the difference: the last new token, the counters
    asked = BATCH * (PROMPT + NEW)
    assert doc["theory"]["kv_cache_tokens"] == asked and doc["theory"]["kv_cache"] == asked * PER_TOKEN
    line = next(g for g in doc["gap"] if g["item"] == "kv_cache")
    assert line["bytes"] == kv["bytes"] - asked * PER_TOKEN == -BATCH * PER_TOKEN + 8 * LAYERS
    measured = doc["measured"]
    assert measured["basis"] == "device_used"
    assert doc["theory"]["total"] + sum(g["bytes"] for g in doc["gap"]) == measured["total_bytes"]


def test_a_dynamic_cache_grows_a_token_a_step_and_its_temporaries_are_not_cache(tmp_path):
    doc, out = report(tmp_path, "dynamic")
    kv = doc["kv_cache"]
    # at the end, each layer's keys and values hold every token fed; while
    # a step concatenates, one layer's old keys are live beside the new
    end = BATCH * (PROMPT + NEW - 1)
    assert kv["most_bytes"] == end * PER_TOKEN + BATCH * (PROMPT + NEW - 2) * PER_TOKEN // (2 * LAYERS)
    cap = allocscope.load(out)
    att = attribute(cap)
    cache = att.category == CATEGORIES.index("kv_cache")
    # every step's keys and values: the prompt's, then one token more each step
    sizes = sorted(set(att.size[cache].tolist()))
    assert sizes == [BATCH * KV_HEADS * HEAD_DIM * 2 * t for t in range(PROMPT, PROMPT + NEW)]
    # the report's waterfall still adds up to the device's memory, from the
    # formula for the tokens asked to what the cache held at the peak
    assert doc["theory"]["kv_cache"] == BATCH * (PROMPT + NEW) * PER_TOKEN
    line = next(g for g in doc["gap"] if g["item"] == "kv_cache")
    assert line["bytes"] == doc["peak"]["by_category"]["kv_cache"] - doc["theory"]["kv_cache"]
    measured = doc["measured"]
    assert doc["theory"]["total"] + sum(g["bytes"] for g in doc["gap"]) == measured["total_bytes"]


@pytest.mark.heavy
def test_fit_searches_the_longest_context_that_fits_and_says_the_cache_a_token(tmp_path):
    pytest.importorskip("transformers")
    batch, new = 8, 4
    p = subprocess.run([sys.executable, "-m", "allocscope", "fit", "--gpu", "L4-24GB", "--gpu-memory", "1GiB", "--json",
                        "-o", str(tmp_path / "fit"), "--search", "CTX=16..16384", "--", sys.executable, GENERATE,
                        "--layers", "2", "--hidden", "512", "--intermediate", "1024", "--heads", "8", "--kv-heads", "2",
                        "--batch-size", str(batch), "--prompt-len", "{CTX}", "--max-new-tokens", str(new),
                        "--cache", "static"], capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    card = json.loads(p.stdout)["cards"][0]
    largest = card["largest"]
    assert 16 < largest < 16384
    assert card["at_largest"]["verdict"] == "fits" and card["at_next"]["verdict"] == "out of memory"
    # the line of memory against the context: the static cache is the
    # formula's bytes a token for each sequence, exactly, plus the new
    # tokens' (and two 8-byte position counters) whatever the context
    per_token = 2 * 2 * 2 * HEAD_DIM * 2
    kv = card["memory"]["parts"]["kv_cache"]
    assert kv["per_unit_bytes"] == pytest.approx(batch * per_token, abs=1e-3)
    assert kv["fixed_bytes"] == batch * (new - 1) * per_token + 2 * 8 and kv["residual_bytes"] == 0
