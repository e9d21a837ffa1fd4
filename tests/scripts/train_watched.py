"""Recorded by tests through `allocscope run`: watches its model with the
module-level API, which does nothing when run without allocscope."""

import torch
from torch import nn

import allocscope

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.Adam(model.parameters())
watched = allocscope.watch(model, opt)
for _ in range(3):
    loss = model(torch.randn(8, 16)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
allocscope.mark("done")
print("watched" if watched is not None else "not watched")
