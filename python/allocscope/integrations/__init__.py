"""allocscope inside training frameworks, for people who do not write their
own loop: a callback that records chosen optimizer steps of a real run,
watching the framework's model and optimizer, one capture per rank.

    from allocscope.integrations.huggingface import AllocscopeTrainerCallback   # transformers.Trainer
    from allocscope.integrations.lightning import AllocscopeLightningCallback   # lightning.pytorch.Trainer

Each module imports its framework (an optional dependency) when imported;
this package imports nothing."""

__all__: list[str] = []
