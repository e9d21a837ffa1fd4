"""A Lightning callback that records chosen optimizer steps (steps as the
Trainer counts them, `trainer.global_step`):

    from allocscope.integrations.lightning import AllocscopeLightningCallback

    trainer = L.Trainer(max_steps=100, callbacks=[AllocscopeLightningCallback("train.alsc", steps=(10, 12))])
    trainer.fit(model, data)  # then: allocscope report train.alsc

Recording starts at the first batch of step 10 and stops once step 12 has
ended, or when fitting ends or fails; the LightningModule and its optimizer
are watched; a mark `step N` opens each batch of those steps. With several
processes, each rank writes train.rank{N}.alsc. It subclasses
`lightning.pytorch.Callback` (or, without the `lightning` package,
`pytorch_lightning.Callback`): importing this module imports it."""

from __future__ import annotations

import os
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback

from .steps import StepRecorder

__all__ = ["AllocscopeLightningCallback"]


class AllocscopeLightningCallback(Callback):  # type: ignore[misc]
    """path: the capture; steps: a step, (first, last) inclusive, or a
    range; device, stacks, ops: as allocscope.record's."""

    def __init__(self, path: str | os.PathLike[str] = "allocscope.alsc", steps: Any = (10, 12), *,
                 device: Any = None, stacks: str = "python", ops: bool | None = None):
        super().__init__()
        self.steps = StepRecorder(path, steps, device=device, stacks=stacks, ops=ops)

    @property
    def written(self) -> list[str]:
        """The captures written so far."""
        return list(self.steps.written)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.steps.step_begins(trainer.global_step, pl_module, optimizer, rank=trainer.global_rank,
                               world=trainer.world_size)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.steps.step_ended(trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.steps.stop("training ended")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.steps.stop(f"exception: {type(exception).__name__}")
