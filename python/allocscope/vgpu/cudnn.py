"""The virtual GPU's cuDNN: which tables its stand-in answers from.

The stand-in libcudnn (csrc/vgpu/cudnn_*.cpp) gives torch the workspaces (and
batch norm's reserve spaces) recorded on real cards, from the file named by
ALLOCSCOPE_VGPU_CUDNN_TABLES (default: the tables shipped with allocscope);
csrc/vgpu/cudnn_tables.h has the rule, docs/vgpu.md the coverage.
"""

from __future__ import annotations

import os

__all__ = ["CUDNN_TABLES", "ENV_CUDNN_TABLES", "stand_in", "table_path", "table_rows"]

ENV_CUDNN_TABLES = "ALLOCSCOPE_VGPU_CUDNN_TABLES"
CUDNN_TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cudnn_tables.tsv")
_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libcudnn.so.9")


def stand_in() -> bool:
    """Whether this allocscope was built with the cuDNN stand-in."""
    return os.path.isfile(_LIB)


def table_path() -> str:
    return os.environ.get(ENV_CUDNN_TABLES) or CUDNN_TABLES


def table_rows() -> dict[str, int]:
    """{card name: rows} of the tables in effect (an unreadable file: none)."""
    rows: dict[str, int] = {}
    try:
        with open(table_path()) as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    card = line.split("\t", 1)[0]
                    rows[card] = rows.get(card, 0) + 1
    except OSError:
        pass
    return rows
