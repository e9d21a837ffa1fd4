"""A model whose layers run on known source lines (LINES), for the tests of
the forward stack that backward allocations inherit."""

import inspect

import torch
from torch import nn


class Layered(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.norm = nn.LayerNorm(64)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x):
        h = self.fc1(x)  # line: fc1
        h = self.norm(h)  # line: norm
        h = torch.relu(h)  # line: relu
        return self.fc2(h)  # line: fc2


LINES = {}
_source, _first = inspect.getsourcelines(Layered.forward)
for _offset, _text in enumerate(_source):
    if "# line: " in _text:
        LINES[_text.split("# line: ")[1].strip()] = _first + _offset
