"""Other tools' formats: PyTorch memory snapshots in (snapshot.py) and out
(memory_viz.py), Chrome/Perfetto traces out (perfetto.py)."""

from .memory_viz import export_memory_viz
from .perfetto import export_perfetto
from .snapshot import SnapshotError, import_snapshot, read_snapshot

__all__ = ["SnapshotError", "export_memory_viz", "export_perfetto", "import_snapshot", "read_snapshot"]
