"""The ways real programs start and end the processes that use CUDA, each
recorded by tests through `allocscope run` and `fit` (test_process_forms.py);
never imports allocscope. Every process that trains appends {"pid",
"max_reserved"} (torch's own peak) to the file named by $FORMS_TRUTH.

    python process_forms.py FORM
    python -m pkg.process_forms FORM    (a copy in a package)
    torchrun --nproc-per-node 2 process_forms.py plain
    accelerate launch process_forms.py accelerate
"""

import os
import signal
import sys
import time


def said(max_reserved):
    import json

    with open(os.environ["FORMS_TRUTH"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "max_reserved": max_reserved}) + "\n")


def train(device=None, wrap=None):
    import torch
    from torch import nn

    device = device or f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
    opt = torch.optim.Adam(model.parameters())
    if wrap is not None:
        model, opt = wrap(model, opt)
    for _ in range(2):
        model(torch.randn(64, 256, device=device)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize(device)
    said(torch.cuda.max_memory_reserved(device))


def spawned(index):
    import torch

    torch.cuda.set_device(index)
    train(f"cuda:{index}")


def dataloader_fork():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(256, 256))
    loader = DataLoader(data, batch_size=64, num_workers=2, multiprocessing_context="fork", pin_memory=True)
    model = torch.nn.Linear(256, 256).cuda()
    for (batch,) in loader:  # the workers fork after CUDA is up: they only read the tensors
        model(batch.cuda(non_blocking=True)).sum().backward()
    train()


def engine(ready, parent_death, handler=True):
    """vLLM's engine core: a forked child runs the model and serves until
    its parent ends it with SIGTERM, which a handler turns into SystemExit
    (as vLLM's does; without the handler, SIGTERM's default action kills
    it); or, where the parent dies, until the parent-death signal comes, on
    which it shuts down for a while (the run has ended by then: it must
    wait for this capture)."""
    def shutdown(signum, frame):
        if parent_death:
            time.sleep(1.0)
        raise SystemExit()

    if handler:
        signal.signal(signal.SIGTERM, shutdown)
    if parent_death:
        # It keeps none of the command's output pipes (as an engine logging
        # to files): nothing but allocscope run waits for it to end.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    train()
    ready.set()
    while True:
        time.sleep(0.01)


def serve(parent_death, method="fork", daemon_left=False):
    """The parent imports torch and never initializes CUDA, so that it can
    fork the engine; or (method "spawn", as vLLM does where CUDA is up)
    initializes CUDA, holds no memory, and spawns it. daemon_left: the
    parent just returns, and multiprocessing's exit terminates the engine
    (a daemonic process without a SIGTERM handler)."""
    import multiprocessing

    import torch

    if method == "spawn":
        torch.cuda.init()
    ctx = multiprocessing.get_context(method)
    ready = ctx.Event()
    proc = ctx.Process(target=engine, args=(ready, parent_death, not daemon_left), daemon=True)
    proc.start()
    if not ready.wait(120):
        raise SystemExit("the engine did not start")
    if daemon_left:
        return
    if parent_death:
        os.kill(os.getpid(), signal.SIGKILL)
    proc.terminate()
    proc.join()
    print("engine exit code", proc.exitcode)
    if method == "spawn":
        said(torch.cuda.max_memory_reserved())


def main(form):
    if form == "plain":
        train()
    elif form == "os_exit":
        train()
        sys.stdout.flush()
        os._exit(0)
    elif form == "spawn":
        import torch.multiprocessing

        torch.multiprocessing.spawn(spawned, nprocs=2)
    elif form == "dataloader_fork":
        dataloader_fork()
    elif form in ("engine", "engine_orphaned"):
        serve(parent_death=form == "engine_orphaned")
    elif form == "engine_daemon":
        serve(parent_death=False, daemon_left=True)
    elif form == "engine_spawned":
        serve(parent_death=False, method="spawn")
    elif form == "accelerate":
        from accelerate import Accelerator

        accelerator = Accelerator()
        train(str(accelerator.device), wrap=accelerator.prepare)
    else:
        raise SystemExit(f"unknown form {form}")


if __name__ == "__main__":
    main(sys.argv[1])
