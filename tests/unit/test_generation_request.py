"""What a generate() call asks (recording/generation.py): read from its
arguments by a wrapper on the instance, or from the frame of a call under
way, on a stand-in for a Hugging Face model (no transformers needed)."""

import types

import torch

from allocscope.recording.generation import GenerateWatch, generation_request, running_generation


class Generator:
    """The parts of transformers' GenerationMixin the wrapper reads."""

    def __init__(self, **config):
        self.generation_config = types.SimpleNamespace(**{"max_new_tokens": None, "max_length": 20, "num_beams": 1,
                                                          "num_return_sequences": 1, **config})
        self.seen = None

    def generate(self, inputs=None, generation_config=None, **kwargs):
        input_ids = inputs  # (generate() expands them first: the frame holds them expanded)
        generation_config = generation_config or self.generation_config
        self.seen = running_generation(self)
        return input_ids.shape, generation_config, kwargs


def test_the_request_is_the_batch_expanded_the_prompt_and_the_new_tokens():
    ids = torch.zeros(3, 10, dtype=torch.long)
    model = Generator()
    assert generation_request(model, (ids,), {"max_new_tokens": 7}) == {
        "sequences": 3, "prompt_tokens": 10, "max_new_tokens": 7}
    # max_length counts the prompt; beams (or returned sequences) multiply the batch
    assert generation_request(model, (), {"input_ids": ids, "num_beams": 4}) == {
        "sequences": 12, "prompt_tokens": 10, "max_new_tokens": 10}
    assert generation_request(Generator(num_return_sequences=2), (ids,), {})["sequences"] == 6
    embeds = torch.zeros(2, 5, 16)
    assert generation_request(model, (), {"inputs_embeds": embeds, "max_new_tokens": 1})["prompt_tokens"] == 5
    assert generation_request(model, (), {}) is None
    assert generation_request(Generator(max_length=None), (ids,), {}) is None


def test_the_wrapper_says_each_call_and_calls_generate_unchanged_and_remove_unwraps():
    model, said = Generator(), []
    watch = GenerateWatch(model, said.append)
    ids = torch.zeros(2, 4, dtype=torch.long)
    shape, config, kwargs = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert shape == (2, 4) and kwargs == {"max_new_tokens": 3, "do_sample": False}
    assert said == [{"sequences": 2, "prompt_tokens": 4, "max_new_tokens": 3}]
    # a call under way reads the same from its frame
    assert model.seen == {"sequences": 2, "prompt_tokens": 4, "max_new_tokens": 16}
    watch.remove()
    assert "generate" not in vars(model)
    model.generate(ids)
    assert len(said) == 1


def test_a_model_without_generate_is_left_alone():
    model = torch.nn.Linear(2, 2)
    GenerateWatch(model, lambda request: None).remove()
    assert "generate" not in vars(model) and running_generation(model) is None
