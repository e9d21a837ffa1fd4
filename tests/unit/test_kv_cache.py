"""Which allocations are a KV cache (attribution/kv_cache.py), on synthetic
captures: the stack's user frame decides, and a cache's temporaries freed
within the model call that made them are not cache."""

import pytest

import allocscope
from allocscope.attribution import CATEGORIES, attribute
from allocscope.capture.format import EventKind
from allocscope.capture.writer import CaptureWriter

pytestmark = pytest.mark.torch_agnostic

SITE = "/venv/lib/python3.11/site-packages"
TORCH_CAT = (f"{SITE}/torch/functional.py", "cat", 10)
CACHE_UPDATE = (f"{SITE}/transformers/cache_utils.py", "DynamicLayer.update", 136)
ATTENTION = (f"{SITE}/transformers/models/llama/modeling_llama.py", "LlamaAttention.forward", 252)
ENGINE_INIT = (f"{SITE}/vllm/v1/engine/core.py", "EngineCore._initialize_kv_caches", 250)
ALLOCATE = (f"{SITE}/vllm/v1/worker/gpu/attn_utils.py", "allocate_kv_cache", 596)
SAMPLER = (f"{SITE}/vllm/v1/sample/sampler.py", "Sampler.apply_sampling_params", 242)


def categories(tmp_path, build):
    b = CaptureWriter()
    build(b)
    att = attribute(allocscope.load(b.write(tmp_path / "kv.alsc")))
    return {int(s): CATEGORIES[c] for s, c in zip(att.size.tolist(), att.category.tolist(), strict=True)}


def test_the_user_frame_decides_not_any_frame(tmp_path):
    def build(b):
        # vLLM warms its sampler up inside _initialize_kv_caches: not cache
        b.alloc(0x1000, 100, stack=b.stack([SAMPLER, ENGINE_INIT]))
        b.alloc(0x2000, 200, stack=b.stack([ALLOCATE, ENGINE_INIT]))
        # torch's own frames between the cache and the allocation are passed by
        b.alloc(0x3000, 300, stack=b.stack([TORCH_CAT, CACHE_UPDATE, ATTENTION]))
        b.alloc(0x4000, 400, stack=b.stack([ATTENTION]))

    got = categories(tmp_path, build)
    assert got[200] == got[300] == "kv_cache"
    assert got[100] != "kv_cache" and got[400] != "kv_cache"


def test_a_cache_allocation_freed_within_its_model_call_is_not_cache(tmp_path):
    def build(b):
        cache = b.stack([CACHE_UPDATE, ATTENTION])
        b.free(0x9000)  # the exit of a call that began before recording, then its free
        b.annotate(EventKind.MODULE_EXIT, "Model")
        for step in range(2):
            b.annotate(EventKind.MODULE_ENTER, "Model")
            b.alloc(0x1000 * (step + 1), 1000 + step, stack=cache)  # the keys, kept to the next step
            b.alloc(0x8000 + step, 10 + step, stack=cache)  # dequantized keys, freed in the call
            b.free(0x8000 + step)
            if step:
                b.free(0x1000)
            b.annotate(EventKind.MODULE_EXIT, "Model")

    got = categories(tmp_path, build)
    assert got[1000] == got[1001] == "kv_cache"
    assert got[10] != "kv_cache" and got[11] != "kv_cache"
