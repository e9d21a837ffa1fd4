"""A serving engine's own figures read from its log (reports/serving.py), on
lines vLLM 0.33.0 wrote on the virtual L4 (tests/data/vllm/: the lines of
two runs of examples/vllm_generate.py under allocscope fit, the model's
temporary folder replaced by MODEL)."""

from allocscope.reports.fit import card_lines
from allocscope.reports.serving import GIB, engine_figures, engine_refusal, serving_lines, serving_side_by_side

from ..conftest import ROOT

DATA = f"{ROOT}/tests/data/vllm"


def read(name):
    with open(f"{DATA}/{name}", encoding="utf-8") as f:
        return f.read()


def test_a_run_that_served_gives_vllms_figures_in_bytes_as_it_rounded_them():
    said = engine_figures(read("vllm-0.33.0-l4-serves.log"))
    assert said["engine"] == "vllm" and said["version"] == "0.33.0"
    assert said["kv_cache_tokens"] == 20_652_992
    assert said["max_model_len"] == 1024 and said["max_concurrency"] == 20168.94
    assert said["kv_cache_bytes"] == round(19.7 * GIB)
    assert said["graph_bytes"] == round(0.02 * GIB) and said["graph_estimate_bytes"] == round(0.03 * GIB)
    assert said["consumed_bytes"] == round(0.04 * GIB) and said["peak_activation_bytes"] == round(0.1 * GIB)
    # its suggestions are exact bytes
    assert said["kv_cache_memory_to_fit"] == 20966224692 and said["kv_cache_memory_to_fill"] == 22774284288
    assert "refusal" not in said


def test_a_refusal_for_want_of_kv_cache_memory_says_the_shortfall_and_vllms_longest_length():
    log = read("vllm-0.33.0-l4-8gib-refuses.log")
    refusal = engine_refusal(log)
    # the shortfall: the cache of the tokens past vLLM's longest length (the
    # GiB figures' difference, rounded, would be 0 near the boundary)
    assert refusal == {"max_model_len": 131072, "needed_bytes": 8 * GIB, "available_bytes": round(6.96 * GIB),
                       "shortfall_bytes": (131072 - 113952) * 8 * GIB // 131072, "estimated_max_model_len": 113952}
    said = engine_figures(log)
    assert said["refusal"] == refusal and "kv_cache_tokens" not in said
    text = "\n".join(serving_lines(serving_side_by_side(None, said, None)))
    assert "refused to start: one request of max_model_len 131,072 needs 8.00 GiB" in text
    assert "max_model_len=113952 would fit" in text


def test_a_log_without_an_engine_says_nothing():
    assert engine_figures("Traceback (most recent call last):\nValueError: bad\n") is None
    assert engine_refusal("") is None
    assert serving_lines(None) == []


def test_the_card_sets_the_measured_concurrency_beside_the_logged():
    said = engine_figures(read("vllm-0.33.0-l4-serves.log"))
    measured = {"engine": "vllm", "weights_bytes": 1 << 25, "kv_cache_bytes": 10 << 30, "graph_pool_bytes": 2 << 20,
                "outside_allocator_bytes": 512 << 20, "profile_run": {"peak_activation_bytes": 70 << 20},
                "capture_model": {"reserved_bytes": 22 << 20}}
    serving = serving_side_by_side(measured, said, {"tokens": 10_326_496})
    # measured tokens over the max_model_len vLLM logged
    assert serving["max_model_len"] == 1024 and serving["max_concurrency"] == round(10_326_496 / 1024, 2)
    text = "\n".join(serving_lines(serving))
    assert "concurrency at 1,024 tokens" in text and "20168.94x" in text and "10084.47x" in text
    assert "22.00 MiB more reserved" in text and "2.00 MiB in private pools" in text
    assert "--kv-cache-memory=22774284288 to fill the card" in text
    card = {"verdict": "fits", "peak": {"event": -1}, "serving": serving, "exit_status": 0}
    assert any("vLLM 0.33.0 logged" in line for line in card_lines(card))
