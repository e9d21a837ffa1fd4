"""The environment of a process on the virtual GPU (vgpu.environment): the
devices' settings, the engines' fallbacks where the user chose none, and
the stand-ins' linker names first on LIBRARY_PATH, for code that is built
and linked at run time (FlashInfer's JIT kernels link -lcuda -lcudart)."""

import os

from allocscope import vgpu


def test_code_built_at_run_time_links_against_the_stand_ins():
    env = vgpu.environment("L4-24GB", base={"LIBRARY_PATH": f"/opt/cuda/lib64{os.pathsep}{vgpu.LINK_DIR}"})
    assert env["LIBRARY_PATH"].split(os.pathsep) == [vgpu.LINK_DIR, "/opt/cuda/lib64"]
    assert vgpu.environment("L4-24GB", base={})["LIBRARY_PATH"] == vgpu.LINK_DIR
    if vgpu.available():  # (built: the links name the stand-ins)
        for name, target in (("libcuda.so", "libcuda.so.1"), ("libcudart.so", "libcudart.so.")):
            assert os.path.basename(os.path.realpath(os.path.join(vgpu.LINK_DIR, name))).startswith(target)


def test_an_engine_fallback_is_the_users_where_they_chose():
    assert vgpu.environment("L4-24GB", base={})["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert vgpu.environment("L4-24GB", base={})["FLASHINFER_USE_CUDA_NORM"] == "1"
    assert vgpu.environment("L4-24GB", base={"VLLM_USE_FLASHINFER_SAMPLER": "1"})["VLLM_USE_FLASHINFER_SAMPLER"] == "1"
    assert vgpu.environment("2xH100-80GB", base={})[vgpu.ENV_GPU] == "2xH100-80GB"
