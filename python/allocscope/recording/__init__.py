"""Recording, from Python: starting and stopping the native recorder
(session.py: record, Recording, mark, watch), what a watch adds (watcher.py:
module scopes and tensor labels; phases.py: the phase and step all watches
share; autowatch.py: models and optimizers found without a watch call), what
a capture says about its process (metadata.py), and recording in processes
started by `allocscope run` (autostart.py)."""

from .session import AllocscopeError, Recording, mark, record, watch
from .watcher import Watch

__all__ = ["AllocscopeError", "Recording", "Watch", "mark", "record", "watch"]
