"""examples/moe_train.py with transformers' eager experts loop, counting the experts that ran: that loop adds
each expert's output with one index_add_ per expert hit (transformers' MixtralExperts / Qwen2MoeExperts), so the
count is printed as `experts_run` beside the example's own JSON.

    python tests/scripts/moe_experts_run.py [moe_train.py's arguments]
"""

import json
import os
import runpy
import sys
from contextlib import redirect_stdout
from io import StringIO

import torch

calls = 0
index_add_ = torch.Tensor.index_add_


def counted(self, *args, **kwargs):
    global calls
    calls += 1
    return index_add_(self, *args, **kwargs)


torch.Tensor.index_add_ = counted
example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "moe_train.py")
sys.argv = [example, "--experts-implementation", "eager", *sys.argv[1:]]
out = StringIO()
with redirect_stdout(out):
    runpy.run_path(example, run_name="__main__")
result = json.loads(out.getvalue().strip().splitlines()[-1])
print(json.dumps({**result, "experts_run": calls}))
