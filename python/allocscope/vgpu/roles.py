"""A rank's role in its job, for `allocscope run/fit --world-size`: its
coordinates in the job's DeviceMesh ("pp 3/4, dp_shard 0/16, tp 1/8") and
the pipeline stages it holds ("stage 3 of 4"), noted as the script creates
them, said at exit (distributed.py). Ranks that differ in role are the ones
worth running (docs/vgpu.md, "Ranks together")."""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["describe_role", "record_roles"]

# The mesh the script made that tells most of this rank's place (its
# coordinates in it: names, sizes), and the pipeline stages this rank holds
# (stage index, number of stages).
_mesh: dict[str, Any] = {}
_stages: list[tuple[int, int]] = []


def record_roles() -> None:
    """Notes each DeviceMesh and pipeline stage the script makes (once)."""
    from ..common.torch_hook import after_import

    after_import("torch.distributed.device_mesh", _patch_device_mesh)
    after_import("torch.distributed.pipelining.stage", _patch_pipeline_stage)


def _after_init(cls: type, note: Any) -> None:
    original = cls.__init__
    if getattr(original, "_allocscope_role", False):
        return

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            note(self)
        except Exception:  # a role is a label: never break the script for it
            pass

    init._allocscope_role = True  # type: ignore[attr-defined]
    cls.__init__ = init


def _patch_device_mesh() -> None:
    from torch.distributed.device_mesh import DeviceMesh

    def note(mesh: Any) -> None:
        coordinate = mesh.get_coordinate()
        shape = list(mesh.mesh.shape)
        # The largest mesh, and of meshes over the same ranks (torchtitan
        # makes a flat "world" mesh, then unflattens it into several named
        # views) the first with the most parallel dimensions: a part of a
        # larger mesh, or a flat view, tells less.
        telling = (mesh.mesh.numel(), sum(n > 1 for n in shape))
        if coordinate is None or telling <= tuple(_mesh.get("telling", (0, 0))):
            return
        names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
        _mesh.update(telling=telling, names=list(names), shape=shape, coordinate=list(coordinate))

    _after_init(DeviceMesh, note)


def _patch_pipeline_stage() -> None:
    from torch.distributed.pipelining import stage

    base = getattr(stage, "_PipelineStageBase", None)
    if base is not None:
        _after_init(base, lambda s: _stages.append((int(s.stage_index), int(s.num_stages))))


def describe_role() -> str | None:
    """"stage 3 of 4; pp 3/4, tp 1/2" (None where the script made neither)."""
    parts = []
    if _stages:
        indices = sorted({i for i, _ in _stages})
        parts.append(f"stage{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))} of {_stages[0][1]}")
    if _mesh:
        dims = list(zip(_mesh["names"], _mesh["coordinate"], _mesh["shape"]))
        parallel = [d for d in dims if d[2] > 1] or dims  # a dimension of degree 1 says nothing
        parts.append(", ".join(f"{name} {c}/{n}" for name, c, n in parallel))
    return "; ".join(parts) or None
