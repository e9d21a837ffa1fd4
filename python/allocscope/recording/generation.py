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


_ABSENT = object()
# Per model class whose generate() is wrapped: what its own __dict__ held
# under "generate" (to put back), and the watched models of it, each with
# what to call as a call begins.
_WRAPPED: dict[type, tuple[Any, "weakref.WeakKeyDictionary[Any, Callable[[dict[str, int]], None]]"]] = {}


class GenerateWatch:
    """Each generate() call of one model first emits what it asks; remove()
    stops it. The model's class is wrapped, not the instance: a copy or a
    pickle of the model is the model as it was (an instance attribute would
    go with a deepcopy and call the original, and would not pickle); calls
    of other instances pass through unchanged. The class is unwrapped once
    none of its models is watched."""

    def __init__(self, model: Any, emit: Callable[[dict[str, int]], None]):
        self._class: type | None = None
        self._model = weakref.ref(model)
        cls = type(model)
        generate = getattr(cls, "generate", None)
        if not callable(generate) or not hasattr(model, "generation_config"):
            return
        if cls not in _WRAPPED:
            models: weakref.WeakKeyDictionary[Any, Callable[[dict[str, int]], None]] = weakref.WeakKeyDictionary()

            @functools.wraps(generate)
            def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                said = models.get(self)
                if said is not None:
                    try:
                        request = generation_request(self, args, kwargs)
                    except Exception:  # a label, never a reason to break the script
                        request = None
                    if request is not None:
                        said(request)
                return generate(self, *args, **kwargs)

            _WRAPPED[cls] = (cls.__dict__.get("generate", _ABSENT), models)
            setattr(cls, "generate", wrapper)
        _WRAPPED[cls][1][model] = emit
        self._class = cls

    def remove(self) -> None:
        cls, self._class = self._class, None
        if cls is None or cls not in _WRAPPED:
            return
        own, models = _WRAPPED[cls]
        model = self._model()
        if model is not None:
            models.pop(model, None)
        if len(models) == 0:
            del _WRAPPED[cls]
            if own is _ABSENT:
                delattr(cls, "generate")
            else:
                setattr(cls, "generate", own)


def running_generation(model: Any) -> dict[str, int] | None:
    """What a generate() call of the model already under way asks (a model
    watched inside its own call: allocscope fit, run), read from the
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
