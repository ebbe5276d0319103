"""A Lightning callback that compiles the optimizers configure_optimizers returned with optjit when fitting starts.

    trainer = L.Trainer(..., callbacks=[OptjitCallback()])

Automatic and manual optimization alike: Lightning steps the optimizer inside its LightningOptimizer, whose step
is then optjit's. Gradient clipping (gradient_clip_val) and accumulation stay Lightning's; bf16-mixed and
16-mixed precision work as with the torch optimizer (patched without fuse_unscale, the optimizer is not a fused one
to Lightning's GradScaler, which unscales before clipping)."""

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

from .._compiled import patch


class OptjitCallback(pl.Callback):
    """Patches each of the trainer's optimizers with optjit.patch(optimizer, **options) at on_fit_start; `compiled`
    lists the CompiledSteps then."""

    def __init__(self, **options):
        self.options = options
        self.compiled = []

    def on_fit_start(self, trainer, pl_module):
        self.compiled = [patch(optimizer, **self.options) for optimizer in trainer.optimizers]
