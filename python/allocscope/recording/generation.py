"""What a generation asks for: a watched Hugging Face model's generate()
calls, so that the textbook estimate can count the KV cache for the tokens
asked (sequences x (prompt + new tokens) x the bytes a token takes;
attribution/estimate.py). Nothing else of generate() is touched: the
wrapper reads its arguments and calls it."""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any, Callable

__all__ = ["GenerateWatch", "generation_request", "running_generation"]


def generation_request(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, int] | None:
    """{sequences, prompt_tokens, max_new_tokens} of a generate() call, None
    where its arguments do not say (no token ids or embeddings, no length).
    Sequences: the batch times the beams (beam search) or the returned
    sequences (sampling), as generate() expands its inputs."""
    ids = kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None))
    if ids is None:
        ids = kwargs.get("inputs_embeds")
    shape = getattr(ids, "shape", None)
    if shape is None or len(shape) < 2:
        return None
    batch, prompt = int(shape[0]), int(shape[1])
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)

    def option(name: str) -> Any:
        value = kwargs.get(name)
        return value if value is not None else getattr(config, name, None)

    new = option("max_new_tokens")
    if new is None and option("max_length") is not None:
        new = int(option("max_length")) - prompt
    if new is None:
        return None
    expand = max(int(option("num_beams") or 1), int(option("num_return_sequences") or 1))
    return {"sequences": batch * expand, "prompt_tokens": prompt, "max_new_tokens": max(int(new), 0)}


class GenerateWatch:
    """Wraps one model's generate() (on the instance: the class is left as
    it is) so that each call first emits what it asks; remove() unwraps."""

    def __init__(self, model: Any, emit: Callable[[dict[str, int]], None]):
        generate = getattr(type(model), "generate", None)
        self._model = weakref.ref(model)
        self._wrapper: Any = None
        if not callable(generate) or not hasattr(model, "generation_config") or "generate" in vars(model):
            return
        ref = self._model

        @functools.wraps(generate)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            model = ref()
            try:
                request = generation_request(model, args, kwargs)
            except Exception:  # a label, never a reason to break the script
                request = None
            if request is not None:
                emit(request)
            return generate(model, *args, **kwargs)

        # (in the instance's __dict__: nn.Module.__setattr__ would do the same for a function)
        vars(model)["generate"] = self._wrapper = wrapper

    def remove(self) -> None:
        model = self._model()
        if model is not None and self._wrapper is not None and vars(model).get("generate") is self._wrapper:
            del vars(model)["generate"]
        self._wrapper = None


def running_generation(model: Any) -> dict[str, int] | None:
    """What a generate() call of the model already under way asks (a model
    watched inside its own call: allocscope fit, run --watch), read from the
    call's frame: its token ids, expanded already for beams or returned
    sequences, and its prepared generation config. None where no such call
    is on this thread's stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "generate" and frame.f_locals.get("self") is model:
            names = frame.f_locals
            ids = names.get("input_ids")
            config = names.get("generation_config")
            if ids is None or config is None:
                return None
            try:
                return generation_request(model, (), {"input_ids": ids, "generation_config": config,
                                                      "num_beams": 1, "num_return_sequences": 1})
            except Exception:  # a label, never a reason to break the script
                return None
        frame = frame.f_back
    return None
