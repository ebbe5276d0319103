"""optjit inside training frameworks nobody here wrote: HF Trainer, accelerate and Lightning train tiny models built
from configs (no downloads) with a compiled step, each against the same run with plain torch: the same losses, the
same params. One compile per optimizer, no recompiles."""

import math
import os
import warnings

import pytest
import torch

import optjit
from conftest import lion_update

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")
lightning = pytest.importorskip("lightning.pytorch")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", category=UserWarning, module="lightning")
warnings.filterwarnings("ignore", category=FutureWarning)

STEPS = 6


def assert_same_params(a, b, rtol=1e-5, atol=1e-6):
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(x.detach(), y.detach(), rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


# ---- HF Trainer ------------------------------------------------------------------------------------------------


class TokenData(torch.utils.data.Dataset):
    """Random token sequences, the same every run."""

    def __init__(self, count=48, length=12, vocab=64):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2(n_layer=2, n_embd=32):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=n_layer, n_head=2, n_embd=n_embd, vocab_size=64, n_positions=16)
    return transformers.GPT2LMHeadModel(config)


def train_with_trainer(tmp_path, name, optimizers=(None, None), callbacks=None, model=None, **arguments):
    model = model or tiny_gpt2()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / name),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        weight_decay=0.1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        **arguments,
    )
    opt = optimizers[0](model) if callable(optimizers[0]) else None
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=TokenData(), optimizers=(opt, None), callbacks=callbacks
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == STEPS
    return model, losses, trainer


def test_hf_trainer_with_a_patched_optimizer_given_as_optimizers_trains_as_torch(tmp_path):
    compiled = []

    def patched_adamw(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        compiled.append(optjit.patch(opt))
        return opt

    def plain_adamw(model):
        return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

    model, losses, _ = train_with_trainer(tmp_path, "patched", optimizers=(patched_adamw, None))
    reference, reference_losses, _ = train_with_trainer(tmp_path, "plain", optimizers=(plain_adamw, None))
    assert losses == pytest.approx(reference_losses, rel=1e-5)
    assert_same_params(model, reference)
    metrics = compiled[0].metrics()
    assert metrics["steps"] == STEPS and metrics["compiles"] == 1 and metrics["recompiles"] == 0, metrics


def test_hf_trainer_with_the_callback_trains_as_torch(tmp_path):
    from optjit.integrations.transformers import OptjitCallback

    callback = OptjitCallback()
    model, losses, trainer = train_with_trainer(tmp_path, "callback", callbacks=[callback])
    reference, reference_losses, _ = train_with_trainer(tmp_path, "plain")
    assert losses == pytest.approx(reference_losses, rel=1e-5)
    assert_same_params(model, reference)
    # The Trainer's two groups (with and without weight decay), compiled once.
    assert len(trainer.optimizer.optimizer.param_groups) == 2
    metrics = callback.compiled.metrics()
    assert metrics["steps"] == STEPS and metrics["compiles"] == 1 and metrics["recompiles"] == 0, metrics


def test_hf_trainer_with_torchao_8bit_adamw_and_the_callback_trains_as_torchao(tmp_path):
    """TrainingArguments(optim="adamw_torch_8bit"): the Trainer makes torchao's AdamW8bit, the callback patches it;
    n_embd=64 gives matrices of 64 x 192 (quantized: at least 4096 values) beside plain state. The losses equal
    torchao's own run's (its step compiled by torch.compile: seconds on the first step, optjit's milliseconds)."""
    pytest.importorskip("torchao")
    from optjit.integrations.transformers import OptjitCallback

    callback = OptjitCallback()
    model, losses, trainer = train_with_trainer(
        tmp_path, "torchao_optjit", callbacks=[callback], model=tiny_gpt2(1, 64), optim="adamw_torch_8bit"
    )
    reference, reference_losses, _ = train_with_trainer(
        tmp_path, "torchao", model=tiny_gpt2(1, 64), optim="adamw_torch_8bit"
    )
    inner = trainer.optimizer.optimizer
    assert type(inner).__name__ == "AdamW8bit"
    assert any(hasattr(entry, "codes") for state in inner.state.values() for entry in state.values())
    assert losses == pytest.approx(reference_losses, rel=1e-5)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5)
    metrics = callback.compiled.metrics()
    assert metrics["steps"] == STEPS and metrics["compiles"] == 1 and metrics["recompiles"] == 0, metrics


def test_hf_trainer_with_clipping_fused_by_the_callback_trains_as_torch_clipping(tmp_path):
    from optjit.integrations.transformers import OptjitCallback

    callback = OptjitCallback(max_grad_norm=0.05)
    model, losses, _ = train_with_trainer(tmp_path, "fused_clip", callbacks=[callback], max_grad_norm=0.0)
    reference, reference_losses, _ = train_with_trainer(tmp_path, "torch_clip", max_grad_norm=0.05)
    assert losses == pytest.approx(reference_losses, rel=1e-5)
    assert_same_params(model, reference)
    assert callback.compiled.total_norm > 0.05  # it clipped
    assert callback.compiled.kernel_count >= 2  # the norm's pass, then the update


def test_a_step_function_inside_an_optimizer_subclass_trains_in_hf_trainer(tmp_path):
    lion = optjit.step_function(lion_update, name="lion")

    def lion_optimizer(compiled):
        class Lion(torch.optim.Optimizer):
            def __init__(self, params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0):
                super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

            @torch.no_grad()
            def step(self, closure=None):
                for group in self.param_groups:
                    params = [p for p in group["params"] if p.grad is not None]
                    if not params:
                        continue
                    for p in params:
                        if not self.state[p]:
                            self.state[p]["exp_avg"] = torch.zeros_like(p)
                    run = lion if compiled else lion.eager
                    run(
                        params,
                        [p.grad for p in params],
                        [self.state[p]["exp_avg"] for p in params],
                        lr=group["lr"],
                        beta1=group["betas"][0],
                        beta2=group["betas"][1],
                        weight_decay=group["weight_decay"],
                    )

        def make(model):
            decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
            no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
            return Lion([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)

        return make

    model, losses, _ = train_with_trainer(tmp_path, "lion", optimizers=(lion_optimizer(True), None))
    reference, reference_losses, _ = train_with_trainer(
        tmp_path, "lion_eager", optimizers=(lion_optimizer(False), None)
    )
    assert losses == pytest.approx(reference_losses, rel=1e-5)
    assert_same_params(model, reference)
    metrics = lion.metrics()
    # Two groups: two variants, each compiled once, and every later call finds its own.
    assert metrics["compiles"] == 2 and metrics["rebuilds"] == 0 and metrics["cache_hits"] == 2 * STEPS - 2, metrics


# ---- accelerate with a GradScaler --------------------------------------------------------------------------------


def train_with_accelerate(patch, steps=STEPS):
    """A GradScaler loop through accelerate's AcceleratedOptimizer (what accelerate's fp16 does on a GPU): `patch` is
    None (plain torch), "before" (optjit.patch before wrapping), "after" (the wrapper patched after wrapping) or
    "inner" (the optimizer inside patched after wrapping)."""
    from accelerate.optimizer import AcceleratedOptimizer

    accelerate.Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if patch == "before":
        compiled = optjit.patch(opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    wrapped = AcceleratedOptimizer(opt, device_placement=False, scaler=scaler)
    if patch == "after":
        compiled = optjit.patch(wrapped)
    elif patch == "inner":
        compiled = optjit.patch(opt)
    data = torch.Generator().manual_seed(1)
    skipped = []
    for s in range(steps):
        x, y = torch.randn(16, 8, generator=data), torch.randn(16, 4, generator=data)
        wrapped.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        if s == 2:
            with torch.no_grad():
                model[0].weight.grad[0, 0] = float("inf")
        wrapped.step()
        skipped.append(wrapped.step_was_skipped)
    return model, skipped, compiled if patch else None


@pytest.mark.parametrize("when", ["before", "after", "inner"])
def test_accelerate_with_a_grad_scaler_steps_the_compiled_step(when):
    model, skipped, compiled = train_with_accelerate(when)
    reference, reference_skipped, _ = train_with_accelerate(None)
    assert skipped == reference_skipped and skipped[2] and sum(skipped) == 1
    assert_same_params(model, reference)
    metrics = compiled.metrics()
    assert metrics["steps"] == STEPS - 1 and metrics["compiles"] == 1, metrics  # every step that ran was optjit's


# ---- Lightning ---------------------------------------------------------------------------------------------------


class Regression(lightning.LightningModule):
    def __init__(self, manual=False, accumulate=1, clip=None):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        self.automatic_optimization = not manual
        self.accumulate, self.clip = accumulate, clip
        self.losses = []

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
        self.losses.append(loss.item())
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        self.manual_backward(loss / self.accumulate)
        if (index + 1) % self.accumulate == 0:
            if self.clip is not None:
                self.clip_gradients(opt, gradient_clip_val=self.clip, gradient_clip_algorithm="norm")
            opt.step()
            opt.zero_grad()
        return None

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.1)


def regression_data():
    generator = torch.Generator().manual_seed(2)
    x, y = torch.randn(96, 8, generator=generator), torch.randn(96, 4, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def fit(patched, manual=False, precision="32-true", clip=None, accumulate=1):
    from optjit.integrations.lightning import OptjitCallback

    module = Regression(manual=manual, accumulate=accumulate, clip=clip)
    callback = OptjitCallback()
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        precision=precision,
        gradient_clip_val=None if manual else clip,
        accumulate_grad_batches=1 if manual else accumulate,
        callbacks=[callback] if patched else [],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(module, regression_data())
    return module, callback.compiled


@pytest.mark.parametrize(
    "manual, precision, clip, accumulate",
    [
        (False, "32-true", None, 1),
        (False, "bf16-mixed", 0.5, 1),
        (False, "32-true", 0.5, 3),
        (True, "32-true", None, 1),
        (True, "bf16-mixed", 0.5, 2),
    ],
    ids=["automatic", "automatic bf16-mixed clipped", "automatic accumulated clipped", "manual", "manual bf16 clipped"],
)
def test_lightning_trains_as_torch_with_the_callback(manual, precision, clip, accumulate):
    module, compiled = fit(True, manual, precision, clip, accumulate)
    reference, _ = fit(False, manual, precision, clip, accumulate)
    assert len(module.losses) == 12 and all(math.isfinite(loss) for loss in module.losses)
    assert module.losses == pytest.approx(reference.losses, rel=1e-4)
    assert_same_params(module, reference, rtol=1e-4, atol=1e-5)
    metrics = compiled[0].metrics()
    assert metrics["steps"] == 12 // accumulate and metrics["compiles"] == 1 and metrics["recompiles"] == 0, metrics


def test_patching_a_lightning_optimizer_patches_the_optimizer_inside():
    from lightning.pytorch.core.optimizer import LightningOptimizer

    params = [torch.nn.Parameter(torch.randn(4, 3))]
    opt = torch.optim.SGD(params, lr=0.1)
    wrapper = LightningOptimizer(opt)
    compiled = optjit.patch(wrapper)
    assert opt.step.compiled is compiled
    params[0].grad = torch.ones(4, 3)
    before = params[0].detach().clone()
    opt.step()
    torch.testing.assert_close(params[0].detach(), before - 0.1)
    optjit.unpatch(wrapper)
    assert "step" not in vars(opt)
