"""optjit inside training frameworks: a callback for each, importing its framework only when used.

    from optjit.integrations.transformers import OptjitCallback   # Trainer(..., callbacks=[OptjitCallback()])
    from optjit.integrations.lightning import OptjitCallback      # L.Trainer(..., callbacks=[OptjitCallback()])

Each patches the optimizers the framework built (optjit.patch, through the framework's wrappers) when training
starts, with the options given (max_grad_norm, fuse_unscale, ...). docs/frameworks.md has the recipes."""
