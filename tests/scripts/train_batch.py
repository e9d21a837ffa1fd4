"""Recorded by the diff tests at two batch sizes: `train_batch.py BATCH`."""

import sys

import torch
from torch import nn

import allocscope

batch = int(sys.argv[1])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
opt = torch.optim.Adam(model.parameters())
allocscope.watch(model, opt)
for _ in range(3):
    loss = model(torch.randn(batch, 64)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
