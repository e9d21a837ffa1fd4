"""Training loops of several kinds on CUDA, for benchmarks that compare the
allocator model with torch's real allocator (whatif_training.py):

    python benchmarks/training_loops.py NAME [--record OUT.alsc] [--steps N]

conv: convolutions with BatchNorm; recurrent: a 2-layer LSTM; attention: a
decoder with tied embedding weights; checkpointed: the same decoder with
activation checkpointing; growing: the decoder on sequence lengths that grow
every step, with a tensor used on a side stream each step (record_stream),
the pattern that strands cached memory. All with AdamW.

The last line printed is JSON: {"oom": the run ran out of memory,
"max_reserved": torch's peak reserved bytes}. An out-of-memory error ends
the run (recorded, when recording).
"""

import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support.measured_run import measured_run  # noqa: E402

VOCAB, D = 8192, 512


class Decoder(nn.Module):
    def __init__(self, layers: int = 4, ckpt: bool = False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(D, 8, 4 * D, dropout=0.0, batch_first=True,
                                                               norm_first=True) for _ in range(layers))
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.ckpt = ckpt

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        return self.head(x)


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(256, 512, num_layers=2, batch_first=True)
        self.head = nn.Linear(512, 10)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def conv_net() -> nn.Module:
    layers: list[nn.Module] = []
    c = 3
    for width in (64, 128, 256, 512):
        layers += [nn.Conv2d(c, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                   nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                   nn.MaxPool2d(2)]
        c = width
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(512 * 4 * 4, 100))


def batches(name: str, step: int):
    if name == "conv":
        return torch.randn(64, 3, 64, 64, device="cuda")
    if name == "recurrent":
        return torch.randn(32, 128, 256, device="cuda")
    seq = 128 + 96 * step if name == "growing" else 512
    return torch.randint(0, VOCAB, (8, seq), device="cuda")


def train(name: str, steps: int, rec) -> None:
    torch.manual_seed(0)
    model = {"conv": conv_net, "recurrent": Recurrent, "attention": Decoder,
             "checkpointed": lambda: Decoder(ckpt=True), "growing": Decoder}[name]().cuda()
    opt = torch.optim.AdamW(model.parameters())
    if rec is not None:
        rec.watch(model, opt)
    side = torch.cuda.Stream()
    for step in range(steps):
        loss = model(batches(name, step)).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if name == "growing":
            t = torch.empty(1 << (20 + step % 4), device="cuda")  # 4 to 32 MiB
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                t.mul_(2)
            t.record_stream(side)
            del t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("name", choices=["conv", "recurrent", "attention", "checkpointed", "growing"])
    ap.add_argument("--record")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    measured_run(lambda rec: train(args.name, args.steps, rec), args.record)


if __name__ == "__main__":
    main()
