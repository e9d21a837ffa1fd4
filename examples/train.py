"""A small training loop to record: a CNN (convolution, batch norm, linear)
trained with Adam on random data. Uses CUDA when available.

    allocscope run -o demo.alsc -- python examples/train.py --steps 3
"""

import argparse

import torch
from torch import nn

try:
    from allocscope import mark, watch
except ImportError:  # the script runs without allocscope too
    def mark(label: str) -> bool:
        return False

    def watch(model, optimizer=None, **kwargs):
        return None


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = make_model().to(args.device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    watch(model, opt)  # under `allocscope run`: label parameters, gradients, activations, ...
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, 64, 64, device=args.device)
        y = torch.randint(0, 10, (args.batch,), device=args.device)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mark(f"step {step}")
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
