"""What a generate() call asks (recording/generation.py): read from its
arguments by a wrapper on the instance, or from the frame of a call under
way, on a stand-in for a Hugging Face model (no transformers needed)."""

import copy
import pickle
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


class Model(Generator):
    """A model class of its own (picklable: at module level)."""


def test_the_wrapper_says_each_call_and_calls_generate_unchanged_and_remove_unwraps():
    model, other, said = Model(), Model(), []
    watch = GenerateWatch(model, said.append)
    ids = torch.zeros(2, 4, dtype=torch.long)
    shape, config, kwargs = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert shape == (2, 4) and kwargs == {"max_new_tokens": 3, "do_sample": False}
    assert said == [{"sequences": 2, "prompt_tokens": 4, "max_new_tokens": 3}]
    # a call under way reads the same from its frame
    assert model.seen == {"sequences": 2, "prompt_tokens": 4, "max_new_tokens": 16}
    # another instance, and a copy of the watched one, are not watched, and
    # a copy calls generate() on itself, not on the original
    other.generate(ids)
    twin = copy.deepcopy(model)
    twin.generate(ids)
    assert len(said) == 1 and twin.seen is not None and model.seen["max_new_tokens"] == 16
    assert isinstance(pickle.loads(pickle.dumps(model)), Model)
    watch.remove()
    assert "generate" not in vars(Model) and Model.generate is Generator.generate
    model.generate(ids)
    assert len(said) == 1


def test_two_watched_models_of_a_class_each_say_their_own_and_the_class_is_unwrapped_after_both():
    class Own(Generator):
        def generate(self, inputs=None, **kwargs):  # (its own: put back as it was)
            return super().generate(inputs, **kwargs)

    own = Own.__dict__["generate"]
    a, b, said_a, said_b = Own(), Own(), [], []
    watch_a, watch_b = GenerateWatch(a, said_a.append), GenerateWatch(b, said_b.append)
    a.generate(torch.zeros(1, 3, dtype=torch.long), max_new_tokens=1)
    b.generate(torch.zeros(5, 3, dtype=torch.long), max_new_tokens=1)
    assert [r["sequences"] for r in said_a] == [1] and [r["sequences"] for r in said_b] == [5]
    watch_a.remove()
    assert Own.__dict__["generate"] is not own  # b is still watched
    watch_b.remove()
    assert Own.__dict__["generate"] is own


def test_a_model_without_generate_is_left_alone():
    model = torch.nn.Linear(2, 2)
    GenerateWatch(model, lambda request: None).remove()
    assert not hasattr(torch.nn.Linear, "generate") and running_generation(model) is None
