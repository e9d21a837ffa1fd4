"""The training-framework callbacks (allocscope.integrations) with the real
libraries: a Hugging Face Trainer and a Lightning Trainer each train a small
model for 14 steps; the callback records steps 10 to 12 only, with the
framework's model and optimizer watched: the marks are those steps, the
parameters and the optimizer state are the model's and the optimizer's to
the byte. A Hugging Face model watched through the C functions of its
modules' scopes reads as through their Python reference, generate() and
gradient checkpointing included, and nothing of the watch is on it. transformers and lightning are optional dependencies: make test
installs them, and CI fails without them."""

import os

import numpy as np
import pytest
import torch

import allocscope
from allocscope import EventKind
from allocscope.reports.report import build_report

pytestmark = pytest.mark.torch_agnostic


def optional(module: str):
    try:
        return __import__(module)
    except ImportError:
        why = f"{module} is not installed (an optional dependency; make test installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def storage_bytes(tensors) -> int:
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def recorded_steps(cap) -> list[str]:
    ev = cap.events
    return [cap.strings[int(ev.arg[i])] for i in np.flatnonzero(ev.kind == EventKind.MARK)]


def check(path, model, optimizer, name):
    """The capture holds steps 10-12, the model watched, its parameters and
    the optimizer's state exact (at the end: both are alive throughout)."""
    cap = allocscope.load(path)
    assert cap.complete and recorded_steps(cap) == ["step 10", "step 11", "step 12"]
    report = build_report(cap, at="step 12")
    assert report["capture"]["watched"] == [name]
    at = report["at"]["by_category"]
    assert at["parameter"] == storage_bytes(model.parameters())
    assert at["optimizer_state"] == storage_bytes(v for s in optimizer.state.values() for v in s.values())


def test_a_hugging_face_trainer_records_steps_10_to_12(tmp_path):
    transformers = optional("transformers")
    from allocscope.integrations.huggingface import AllocscopeTrainerCallback

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=97,
                                                                 n_positions=16))
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 97, (64, 16))]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=14,
                                          per_device_train_batch_size=4, report_to=[], save_strategy="no",
                                          logging_strategy="no", disable_tqdm=True, use_cpu=True)
    callback = AllocscopeTrainerCallback(tmp_path / "hf.alsc", steps=(10, 12), device="cpu")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    assert callback.written == [str(tmp_path / "hf.alsc")] and trainer.state.global_step == 14
    check(tmp_path / "hf.alsc", model, trainer.optimizer.optimizer, "GPT2LMHeadModel")


def test_a_lightning_trainer_records_steps_10_to_12(tmp_path):
    optional("lightning")
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from allocscope.integrations.lightning import AllocscopeLightningCallback

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,))), batch_size=8)
    callback = AllocscopeLightningCallback(tmp_path / "pl.alsc", steps=range(10, 13), device="cpu")
    trainer = pl.Trainer(max_steps=14, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    module = Tiny()
    trainer.fit(module, data)
    assert callback.written == [str(tmp_path / "pl.alsc")] and trainer.global_step == 14
    check(tmp_path / "pl.alsc", module, trainer.optimizers[0], "Tiny")


def test_steps_and_ranks_as_the_callbacks_take_them(tmp_path):
    from allocscope.integrations.steps import StepRecorder, step_range

    assert step_range(5) == (5, 5) and step_range((10, 12)) == (10, 12) and step_range(range(10, 13)) == (10, 12)
    for bad in ((12, 10), range(0), range(0, 10, 2), "10-12", (-1, 2), True):
        with pytest.raises(allocscope.InputError, match="steps"):
            step_range(bad)
    steps = StepRecorder(tmp_path / "run.alsc", (1, 2))
    assert steps.capture_path(0, 1) == str(tmp_path / "run.alsc")
    assert steps.capture_path(3, 8) == str(tmp_path / "run.rank3.alsc")
    with pytest.raises(allocscope.InputError):
        StepRecorder(tmp_path / "run.alsc", (1, 2), stacks="all")


def _hugging_face_scopes(path, transformers, native):
    """A tiny GPT-2 (built from its config, nothing downloaded) trained two
    steps with gradient checkpointing, then generate() (which reads
    forward's signature): its modules' scopes and the report's meaning."""
    from allocscope.recording.watcher import Watch

    Watch.native_module_hooks = native
    try:
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=97, n_positions=64)
        model = transformers.GPT2LMHeadModel(config)
        model.gradient_checkpointing_enable()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 97, (2, 16))
        def looks(m):  # (what the library itself put there stays; the watch adds nothing: global_hooks.py)
            return sorted(vars(m)), list(m._forward_hooks.values()), list(m._forward_pre_hooks.values())

        before = [looks(m) for m in model.modules()]
        with allocscope.record(path, device="cpu") as rec:
            rec.watch(model, opt)
            assert [looks(m) for m in model.modules()] == before
            for _ in range(2):
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
                opt.zero_grad()
            model.eval()
            out = model.generate(ids[:, :4], max_new_tokens=3, do_sample=False, pad_token_id=0)
            assert out.shape == (2, 7)
    finally:
        Watch.native_module_hooks = True
    cap = allocscope.load(path)
    ev = cap.events
    idx = np.flatnonzero((ev.kind == EventKind.MODULE_ENTER) | (ev.kind == EventKind.MODULE_EXIT))
    report = build_report(cap)
    meaning = {k: report[k] for k in ("measured", "module_classes", "sites", "ops", "gap", "theory")}
    return [(int(ev.kind[i]), cap.strings[int(ev.arg[i])], int(ev.size[i])) for i in idx], meaning


def test_a_hugging_face_model_watched_through_the_c_functions_reads_as_through_python(tmp_path):
    # (the C functions that write each module's scopes, csrc/recorder/module_hooks.h,
    # against their Python reference)
    transformers = optional("transformers")
    scopes, meaning = _hugging_face_scopes(tmp_path / "c.alsc", transformers, True)
    reference = _hugging_face_scopes(tmp_path / "py.alsc", transformers, False)
    assert len({name for _, name, _ in scopes}) > 10
    assert (scopes, meaning) == reference
