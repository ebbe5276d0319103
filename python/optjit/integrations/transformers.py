"""A transformers Trainer callback that compiles the Trainer's optimizer with optjit when training starts.

    trainer = Trainer(model, args, train_dataset=data, callbacks=[OptjitCallback()])

The Trainer makes its optimizer (two param groups: with and without weight decay) and wraps it with accelerate's
AcceleratedOptimizer before on_train_begin; optjit.patch patches the optimizer inside, and the compiled step is
what accelerate steps, with or without a GradScaler. The Trainer's own grad clipping (max_grad_norm) stays its own.
An optimizer given as Trainer(optimizers=(opt, scheduler)) may also be patched before: optjit.patch(opt)."""

import transformers

from .._compiled import patch


class OptjitCallback(transformers.TrainerCallback):
    """Patches the Trainer's optimizer with optjit.patch(optimizer, **options) at on_train_begin; `compiled` is the
    CompiledStep then (its metrics() say what compiling and stepping did)."""

    def __init__(self, **options):
        self.options = options
        self.compiled = None

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if optimizer is not None:
            self.compiled = patch(optimizer, **self.options)
