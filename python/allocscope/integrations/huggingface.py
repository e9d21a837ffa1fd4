"""A Hugging Face `transformers.Trainer` callback that records chosen
optimizer steps (steps as the Trainer counts them, `state.global_step`):

    from allocscope.integrations.huggingface import AllocscopeTrainerCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[AllocscopeTrainerCallback("train.alsc", steps=(10, 12))])
    trainer.train()          # then: allocscope report train.alsc

Recording starts at the beginning of step 10 (the batches the Trainer
fetched ahead are already there) and stops once step 12 has ended, or when
training ends; the Trainer's model and optimizer are watched (categories,
modules, phases); a mark `step N` opens each step. With several processes,
each rank writes train.rank{N}.alsc. Importing this module imports
transformers."""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from .steps import StepRecorder

__all__ = ["AllocscopeTrainerCallback"]


class AllocscopeTrainerCallback(TrainerCallback):  # type: ignore[misc]
    """path: the capture; steps: a step, (first, last) inclusive, or a
    range; device, stacks, ops: as allocscope.record's."""

    def __init__(self, path: str | os.PathLike[str] = "allocscope.alsc", steps: Any = (10, 12), *,
                 device: Any = None, stacks: str = "python", ops: bool | None = None):
        self.steps = StepRecorder(path, steps, device=device, stacks=stacks, ops=ops)

    @property
    def written(self) -> list[str]:
        """The captures written so far."""
        return list(self.steps.written)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                      **kwargs: Any) -> None:
        self.steps.step_begins(state.global_step, model, optimizer, rank=args.process_index, world=args.world_size)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.step_ended(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.stop("training ended")
