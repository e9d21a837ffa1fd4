"""A rank's role in its job, as the script's DeviceMeshes say it (vgpu/roles.py)."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from allocscope.vgpu import roles
    roles.record_roles()
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
    world = init_device_mesh("cpu", (8,), mesh_dim_names=("world",))
    print(roles.describe_role())
    dense = world._unflatten(0, (2, 1, 2, 2), ("pp", "dp_replicate", "fsdp", "tp"))
    print(roles.describe_role())
    dense["fsdp", "tp"]
    world._unflatten(0, (2, 2, 1, 2), ("pp", "batch", "cp", "tp"))
    print(roles.describe_role())
""")


def test_the_most_telling_view_of_the_world_names_the_role():
    # torchtitan's way: a flat "world" mesh unflattened into named views;
    # a part of one (dense["fsdp", "tp"]) or a later view with as many
    # parallel dimensions does not replace the first, and a dimension of
    # degree 1 is left out
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["world 5/8", "pp 1/2, fsdp 0/2, tp 1/2", "pp 1/2, fsdp 0/2, tp 1/2"]
