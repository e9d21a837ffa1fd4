"""Which frames are torch's or allocscope's (capture/stacks.py is_library):
the rule that picks the user's line, folds library frames and finds the
frame a KV cache or an engine allocates from."""

import pytest

from allocscope.capture.stacks import is_library


@pytest.mark.parametrize("filename", [
    "/usr/lib/python3/dist-packages/torch/nn/modules/module.py",
    "/home/u/.venv/lib/python3.12/site-packages/torch/nn/functional.py",
    # a venv in a folder named torch: torch's own file is still torch's
    "/opt/torch/.venv/lib/python3.12/site-packages/torch/_tensor.py",
    "C:\\Python312\\Lib\\site-packages\\torch\\autograd\\__init__.py",
    # a source checkout or an editable install has no site-packages
    "/home/u/pytorch/torch/autograd/graph.py",
    "/work/allocscope/python/allocscope/recording/phases.py",
    "<frozen importlib._bootstrap>",
])
def test_torch_and_allocscope_frames_are_library_frames(filename):
    assert is_library(filename)


@pytest.mark.parametrize("filename", [
    "/home/u/train.py",
    # the card's own venv lives in /opt/torch/.venv: a library installed
    # there is that library, not torch (a KV cache found by transformers'
    # cache_utils.py frame was lost on the card before)
    "/opt/torch/.venv/lib/python3.12/site-packages/transformers/cache_utils.py",
    "/opt/torch/.venv/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py",
    "/home/u/envs/allocscope/lib/python3.11/site-packages/accelerate/big_modeling.py",
    "/home/u/.venv/lib/python3.12/site-packages/torchvision/models/resnet.py",
])
def test_other_packages_and_user_files_are_not(filename):
    assert not is_library(filename)
