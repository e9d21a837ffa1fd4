"""Object collectives and point-to-point object calls on the virtual GPU's
NCCL (docs/vgpu.md, "Many GPUs").

The virtual NCCL carries no bytes, and the tensor a source pickles its
objects into is made by kernels that compute nothing, so torch's own
`*_object*` calls would hand the other ranks zeros. Where all the ranks of
a run are processes (torchrun on virtual cards), the patched calls run
torch's own first, for its allocations and its NCCL calls, then pass the
objects through the run's store, which every rank reaches, so that they
return what they return on a card: each collective of a group has a number,
the same in every rank (ranks make a group's collectives in the same order,
as torch requires), and each message from one rank to another a number in
their pair's order. Where only some ranks of the job run (`--world-size`),
those that run exchange so among themselves, and a rank that does not run is
taken to have sent what this rank sent: see distributed.py's docstring for
what each call gives then.

Each patched function takes torch's own signature (read from the function
it replaces), so that a keyword a later torch adds (2.14's `use_batch`,
`weights_only`) reaches torch's function unchanged.
"""

from __future__ import annotations

import functools
import inspect
import pickle
from typing import Any, Callable

__all__ = ["patch_object_calls"]

_NAMES = ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list", "send_object_list",
          "recv_object_list")


def _on_virtual_nccl(group: Any) -> bool:
    import torch.distributed as dist

    try:
        return dist.get_backend(group) == "nccl"
    except Exception:  # not initialized, or not a member: torch's own error
        return False


def _my_rank(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_rank(group) if group is not None else dist.get_rank()


def _group_name(group: Any) -> str:
    import torch.distributed as dist

    return getattr(group if group is not None else dist.group.WORLD, "group_name", "default")


class _Exchange:
    """The run's store, the ranks that run, and the numbers that make a
    call's key the same in every rank that takes part in it."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.running: frozenset[int] | None = None  # None: every rank runs (patch_object_calls)

    def runs(self, global_rank: int) -> bool:
        """Whether that rank runs: it sends what it sends, and hears."""
        return self.running is None or global_rank in self.running

    def next_key(self, channel: str) -> str:
        n = self.counts[channel] = self.counts.get(channel, -1) + 1
        return f"allocscope/objects/{channel}/{n}"

    def collective(self, group: Any) -> str:
        return self.next_key(_group_name(group))

    def message(self, group: Any, src: int, dst: int) -> str:
        """The key of the next message from global rank src to global rank dst."""
        return self.next_key(f"{_group_name(group)}/p2p/{src}-{dst}")

    @staticmethod
    def store() -> Any:
        import torch.distributed.distributed_c10d as c10d

        return c10d._get_default_store()


_exchange = _Exchange()


def _group_rank(group: Any, rank: int | None, group_rank: int | None) -> int:
    """The group rank of a call's source or destination, given as a global
    rank or a group rank."""
    import torch.distributed as dist

    if group_rank is not None:
        return group_rank
    return dist.get_group_rank(group, rank) if group is not None and rank is not None else (rank or 0)


def _global(group: Any, group_rank: int) -> int:
    import torch.distributed as dist

    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _patched(original: Callable[..., Any], body: Callable[[Callable[..., Any], dict[str, Any]], Any]) -> Any:
    """A function with original's signature: off the virtual NCCL it is
    original; on it, body(call, arguments), where call(**changes) runs
    original with some arguments changed."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        if not _on_virtual_nccl(arguments.get("group")):
            return original(*args, **kwargs)
        return body(lambda **changes: original(**{**arguments, **changes}), arguments)

    return patched


def _all_gather_object(call: Callable[..., Any], a: dict[str, Any]) -> None:
    # torch's own first (its allocations; the virtual NCCL puts this rank's
    # object in every slot), then the others' from the ranks that run.
    call()
    group, out = a["group"], a["object_list"]
    key, store = _exchange.collective(group), _exchange.store()
    store.set(f"{key}/{_my_rank(group)}", pickle.dumps(a["obj"]))
    for i in range(min(len(out), _size(group))):
        if _exchange.runs(_global(group, i)):
            out[i] = pickle.loads(store.get(f"{key}/{i}"))


def _gather_object(call: Callable[..., Any], a: dict[str, Any]) -> None:
    group, out = a["group"], a["object_gather_list"]
    me, dst = _my_rank(group), _group_rank(group, a["dst"], a.get("group_dst"))
    key, store = _exchange.collective(group), _exchange.store()
    if _exchange.runs(_global(group, dst)):
        store.set(f"{key}/{me}", pickle.dumps(a["obj"]))
    if me == dst and out is not None:
        for i in range(min(len(out), _size(group))):
            out[i] = pickle.loads(store.get(f"{key}/{i}")) if _exchange.runs(_global(group, i)) else a["obj"]


def _broadcast_object_list(call: Callable[..., Any], a: dict[str, Any]) -> None:
    import torch.distributed as dist

    group, objects = a["group"], a["object_list"]
    root, me = _group_rank(group, a["src"], a.get("group_src")), _my_rank(group)
    # As its own source: the source's allocations and collectives, and the
    # list comes back as it went.
    if group is None:
        call(src=dist.get_rank(), **({"group_src": None} if "group_src" in a else {}))
    else:
        call(src=None, group_src=me)
    key, store = _exchange.collective(group), _exchange.store()
    if me == root:
        store.set(key, pickle.dumps(list(objects)))
    elif _exchange.runs(_global(group, root)):
        objects[:] = pickle.loads(store.get(key))[:len(objects)]


def _scatter_object_list(call: Callable[..., Any], a: dict[str, Any]) -> None:
    group, out, inputs = a["group"], a["scatter_object_output_list"], a["scatter_object_input_list"]
    me, src = _my_rank(group), _group_rank(group, a["src"], a.get("group_src"))
    key, store = _exchange.collective(group), _exchange.store()
    if not _exchange.runs(_global(group, src)):
        out[0] = inputs[me] if inputs is not None and me < len(inputs) else None
        return
    if me == src:
        for i, item in enumerate(inputs or ()):
            store.set(f"{key}/{i}", pickle.dumps(item))
    out[0] = pickle.loads(store.get(f"{key}/{me}"))


def _send_object_list(call: Callable[..., Any], a: dict[str, Any]) -> None:
    # torch's own (the pickled objects on the device, their sizes, the sends),
    # then the objects themselves to the peer where it runs.
    import torch.distributed as dist

    call()
    group = a["group"]
    dst = _global(group, _group_rank(group, a["dst"], a.get("group_dst")))
    if _exchange.runs(dst):
        _exchange.store().set(_exchange.message(group, dist.get_rank(), dst), pickle.dumps(list(a["object_list"])))


def _recv_object_list(call: Callable[..., Any], a: dict[str, Any]) -> int:
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    group, objects = a["group"], a["object_list"]
    src = _global(group, _group_rank(group, a["src"], a.get("group_src")))
    if not _exchange.runs(src):  # nothing to hear: the list stays as it was
        return src
    received = pickle.loads(_exchange.store().get(_exchange.message(group, src, dist.get_rank())))
    # What torch's own receive allocates on the device, sized by torch's own
    # serialization of what arrived: the sizes, then the bytes (torch's
    # receive into them is what the virtual NCCL cannot carry).
    device = a.get("device") or c10d._get_object_coll_device(group)
    sizes = [c10d._object_to_tensor(obj, "cpu", group)[1] for obj in received[:len(objects)]]
    object_sizes = torch.empty(len(objects), dtype=torch.long, device=device)
    object_bytes = torch.empty(int(sum(int(s.sum()) for s in sizes)), dtype=torch.uint8, device=device)
    del object_sizes, object_bytes
    objects[:len(received)] = received[:len(objects)]
    return src


def _size(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


_BODIES = {"all_gather_object": _all_gather_object, "gather_object": _gather_object,
           "broadcast_object_list": _broadcast_object_list, "scatter_object_list": _scatter_object_list,
           "send_object_list": _send_object_list, "recv_object_list": _recv_object_list}


def patch_object_calls(*, real_ranks: frozenset[int] | None) -> None:
    """Replaces torch.distributed's object calls (once per process).
    real_ranks: the global ranks of the job that run (None: all of them)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    _exchange.running = real_ranks
    if getattr(c10d, "_allocscope_patched", False):
        return
    for name in _NAMES:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        patched = _patched(original, _BODIES[name])
        setattr(c10d, name, patched)
        if getattr(dist, name, None) is original:
            setattr(dist, name, patched)
    c10d._allocscope_patched = True  # type: ignore[attr-defined]
