"""Gradient scaling: a patched optimizer takes GradScaler's scale and inf check as torch's fused optimizers do
(opt.grad_scale, opt.found_inf; _step_supports_amp_scaling), dividing the grads inside the kernel and skipping a step
with an inf or NaN grad. Checked against torch's fused=True optimizers under the same GradScaler (the same contract),
and for all 11 optimizers against torch's own GradScaler path (unscale every grad, skip the step)."""

import warnings

import pytest
import torch

import optjit
from conftest import assert_kernels, assert_same_state

ALL = [
    (torch.optim.Adam, dict(lr=0.01, amsgrad=True, weight_decay=0.1)),
    (torch.optim.AdamW, dict(lr=0.01, maximize=True)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    (torch.optim.Adagrad, dict(lr=0.1, initial_accumulator_value=0.1)),
    (torch.optim.NAdam, dict(lr=0.01)),
    (torch.optim.RAdam, dict(lr=0.01, weight_decay=0.1)),
    (torch.optim.Adamax, dict(lr=0.01)),
    (torch.optim.Adadelta, dict(lr=1.0)),
    (torch.optim.RMSprop, dict(lr=0.01, centered=True)),
    (torch.optim.Rprop, dict(lr=0.01)),
    (torch.optim.ASGD, dict(lr=0.01, t0=2)),
]
FUSED_ON_CPU = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad)
INF_STEP = 3  # the step whose grads overflow


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _train(cls, options, patched, steps=8, fuse_inf_check=False, max_grad_norm=None, nan=False, fuse_unscale=False):
    """`steps` GradScaler steps of a small model (an inf grad at INF_STEP, or a NaN); returns the params, the
    optimizer, the scale before every step, and what optjit measured when patched. Unpatched runs with max_grad_norm
    clip as torch's recipe does: scaler.unscale_(opt), clip_grad_norm_, scaler.step(opt)."""
    model = _model(0)
    params = list(model.parameters())
    opt = cls(params, **options)
    compiled = (
        optjit.patch(opt, max_grad_norm=max_grad_norm, fuse_inf_check=fuse_inf_check, fuse_unscale=fuse_unscale)
        if patched
        else None
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    data = torch.Generator().manual_seed(1)
    scales, grads_after = [], []
    for step in range(steps):
        x, y = torch.randn(16, 8, generator=data), torch.randn(16, 4, generator=data)
        opt.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        if step == INF_STEP:
            with torch.no_grad():
                params[0].grad[0, 0] = float("nan" if nan else "inf")
        scales.append(scaler.get_scale())
        if max_grad_norm is not None and not patched:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        scaler.step(opt)
        scaler.update()
        grads_after.append([p.grad.clone() for p in params])
    return params, opt, scales, grads_after, compiled


@pytest.mark.parametrize(
    "cls,options", [c for c in ALL if c[0] in FUSED_ON_CPU], ids=lambda c: getattr(c, "__name__", "")
)
def test_grad_scaler_matches_torch_fused(cls, options):
    """The same contract as torch's fused kernels: the scale goes in, the grads stay scaled, an inf step is skipped."""
    params, opt, scales, grads, compiled = _train(cls, options, patched=True, fuse_unscale=True)
    fused_params, fused_opt, fused_scales, fused_grads, _ = _train(cls, dict(options, fused=True), patched=False)
    assert scales == fused_scales
    assert scales[INF_STEP] == 2 * scales[0] and scales[INF_STEP + 1] == scales[0]  # grew, then halved at the inf
    assert_same_state(opt, params, fused_opt, fused_params, torch.float32)
    for step, (ours, theirs) in enumerate(zip(grads, fused_grads)):
        # Unscaled in place by the step, except at the skipped step, whose grads stay scaled: compare those at the
        # scale of the others (the params they came from already differ by float rounding).
        scale = scales[step] if step == INF_STEP else 1.0
        for a, b in zip(ours, theirs):
            message = f"grads after step {step}"
            torch.testing.assert_close(a / scale, b / scale, rtol=1e-5, atol=1e-6, msg=lambda m: f"{message}: {m}")
    assert all(torch.isinf(g[0, 0]) for g in (grads[INF_STEP][0], fused_grads[INF_STEP][0]))  # left as they were
    metrics = compiled.metrics()
    assert metrics["skipped_steps"] == 1 and metrics["steps"] == 7  # steps that updated: 8 calls, 1 skipped
    assert metrics["compiles"] == 1 and metrics["recompiles"] == 0  # new scales are values, not new kernels


@pytest.mark.parametrize("cls,options", ALL, ids=lambda c: getattr(c, "__name__", ""))
def test_grad_scaler_matches_torch_unscaling_itself(cls, options):
    """Every optimizer: the patched step gives what torch's own GradScaler path gives (unscale, then step or skip)."""
    params, opt, scales, _, compiled = _train(cls, options, patched=True)
    torch_params, torch_opt, torch_scales, _, _ = _train(cls, dict(options, foreach=False), patched=False)
    assert scales == torch_scales
    assert_same_state(opt, params, torch_opt, torch_params, torch.float32)
    # Patched without fuse_unscale, the optimizer is a non-fused one to GradScaler: it unscales and checks the grads
    # itself, and does not call the step it skips.
    assert not getattr(opt, "_step_supports_amp_scaling", False)
    assert compiled.metrics()["skipped_steps"] == 0 and compiled.metrics()["steps"] == 7


@pytest.mark.parametrize("cls,options", ALL, ids=lambda c: getattr(c, "__name__", ""))
def test_fused_inf_check_replaces_grad_scalers_pass(cls, options, monkeypatch):
    """patch(opt, fuse_inf_check=True): GradScaler hands the step itself (grad_scaler=) and runs no inf-check pass of
    its own; the step checks the grads in its first pass, fills found_inf for scaler.update(), and skips the inf step:
    the same run as torch's own GradScaler path, with one kernel more than the update (the check)."""
    checks = []
    original = torch.amp.GradScaler._check_inf_per_device
    monkeypatch.setattr(
        torch.amp.GradScaler, "_check_inf_per_device", lambda self, o: checks.append(o) or original(self, o)
    )
    with pytest.warns(FutureWarning, match="GradScaler is going to stop passing itself"):
        params, opt, scales, grads, compiled = _train(cls, options, patched=True, fuse_inf_check=True, nan=True)
    assert checks == []  # GradScaler's own pass over the grads never ran
    torch_params, torch_opt, torch_scales, _, _ = _train(cls, dict(options, foreach=False), patched=False, nan=True)
    assert scales == torch_scales  # scaler.update() saw the step's found_inf: grew, then halved at the NaN
    assert_same_state(opt, params, torch_opt, torch_params, torch.float32)
    assert torch.isnan(grads[INF_STEP][0][0, 0])  # a skipped step leaves the grads as they were
    metrics = compiled.metrics()
    assert metrics["skipped_steps"] == 1 and metrics["compiles"] == 1 and metrics["recompiles"] == 0
    plain = _train(cls, options, patched=True, steps=1)[4]
    assert_kernels(compiled, plain.kernel_count + 1)


def test_fused_inf_check_with_clipping_is_one_pass_and_matches_torchs_recipe():
    """unscale_, clip_grad_norm_ and the inf check all happen in the step's first pass: Adam is 2 kernels, and the
    run equals torch's recipe (scaler.unscale_, clip_grad_norm_, scaler.step of a fused Adam)."""
    options = dict(lr=0.01, weight_decay=0.1)
    with pytest.warns(FutureWarning):
        params, opt, scales, _, compiled = _train(
            torch.optim.Adam, options, patched=True, fuse_inf_check=True, max_grad_norm=0.5
        )
    ref_params, ref_opt, ref_scales, _, _ = _train(
        torch.optim.Adam, dict(options, fused=True), patched=False, max_grad_norm=0.5
    )
    assert scales == ref_scales
    assert_same_state(opt, params, ref_opt, ref_params, torch.float32)
    assert_kernels(compiled, 2)
    assert compiled.metrics()["skipped_steps"] == 1


def test_fused_inf_check_after_unscale_reads_the_scalers_found_inf():
    """A loop that calls scaler.unscale_(opt) itself (to clip, say) has grads unscaled and checked already: the step
    reads that found_inf and divides by nothing, as torch's fused optimizers do."""
    models = [_model(0), _model(0)]
    opts = [torch.optim.Adam(models[0].parameters(), lr=0.01), torch.optim.Adam(models[1].parameters(), lr=0.01, fused=True)]
    compiled = optjit.patch(opts[0], fuse_inf_check=True)
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**10) for _ in models]
    data = torch.Generator().manual_seed(1)
    for step in range(4):
        x, y = torch.randn(16, 8, generator=data), torch.randn(16, 4, generator=data)
        for model, opt, scaler in zip(models, opts, scalers):
            opt.zero_grad()
            scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
            if step == 2:
                with torch.no_grad():
                    next(model.parameters()).grad[0, 0] = float("inf")
            scaler.unscale_(opt)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                scaler.step(opt)
            scaler.update()
    scaler, ref_scaler = scalers
    assert scaler.get_scale() == ref_scaler.get_scale() == 2.0**9
    assert_same_state(opts[0], list(models[0].parameters()), opts[1], list(models[1].parameters()), torch.float32)
    assert compiled.metrics()["skipped_steps"] == 1
    assert_kernels(compiled, 1)  # no check of its own: the scaler's unscale_ did it


def test_found_inf_skips_before_any_state_exists():
    """A skipped first step creates no torch state; the next step is the first one, as if the skip never happened."""
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, torch_opt = torch.optim.Adam(params, lr=0.1), torch.optim.Adam(reference, lr=0.1)
    step = optjit.compile(opt)
    opt.grad_scale, opt.found_inf = torch.tensor(4.0), torch.tensor([1.0])
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    before = [p.detach().clone() for p in params]
    step()
    assert all(torch.equal(a, b) for a, b in zip(params, before)) and len(opt.state) == 0
    opt.found_inf.zero_()
    grads = [torch.randn_like(p) for p in params]
    for p, r, g in zip(params, reference, grads):
        p.grad, r.grad = 4 * g, g.clone()
    step()
    torch_opt.step()
    assert_same_state(opt, params, torch_opt, reference, torch.float32)
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))  # left unscaled, as torch's fused kernels do
    del opt.grad_scale, opt.found_inf  # GradScaler deletes them after its step: plain steps again
    for p, r in zip(params, reference):
        p.grad = r.grad.clone()
    step()
    torch_opt.step()
    assert_same_state(opt, params, torch_opt, reference, torch.float32)
    assert step.metrics()["recompiles"] == 1  # scaling off is another variant of the step


def test_bad_grad_scaling_objects_are_errors():
    params = [torch.nn.Parameter(torch.randn(3))]
    params[0].grad = torch.randn(3)
    opt = torch.optim.SGD(params, lr=0.1)
    step = optjit.compile(opt)
    opt.grad_scale = 2.0
    with pytest.raises(optjit.Error, match="optimizer.grad_scale is float, not a tensor"):
        step()
    opt.grad_scale = torch.tensor([1.0, 2.0])
    with pytest.raises(optjit.Error, match=r"grad_scale is f32\[2\] on cpu: a gradient scaler's grad_scale holds one"):
        step()
    opt.grad_scale = torch.tensor([2.0], dtype=torch.float64)
    with pytest.raises(optjit.Error, match=r"grad_scale is f64\[1\] on cpu: a gradient scaler's grad_scale holds one f32"):
        step()
    opt.grad_scale = torch.tensor(0.0)
    with pytest.raises(optjit.Error, match="grad_scale is 0.0: a gradient scale must be a positive finite number"):
        step()


def test_fused_inf_check_skipping_a_first_step_leaves_no_state():
    """The step's own check finds a NaN on the very first step: nothing changes and no torch state is made; the next
    step is then the first, as with torch's fused Adam's trajectory."""
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))]
    opt = torch.optim.Adam(params, lr=0.1)
    compiled = optjit.patch(opt, fuse_inf_check=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(sum(p.sum() for p in params)).backward()
    params[1].grad[2] = float("nan")
    before = [p.detach().clone() for p in params]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scaler.step(opt)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(params, before)) and len(opt.state) == 0
    assert scaler.get_scale() == 2.0  # update() read the step's found_inf
    assert compiled.metrics()["skipped_steps"] == 1


def test_one_grad_scaler_for_a_patched_and_a_plain_optimizer():
    """scaler.update() combines every optimizer's found_inf: the patched step's is 0-d, as GradScaler's own."""
    models = [_model(0), _model(1)]
    opts = [torch.optim.SGD(models[0].parameters(), lr=0.1), torch.optim.Adam(models[1].parameters(), lr=0.01)]
    optjit.patch(opts[1], fuse_inf_check=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    for step in range(3):
        for opt in opts:
            opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(m(x), y) for m in models)
        scaler.scale(loss).backward()
        if step == 1:
            with torch.no_grad():
                next(models[1].parameters()).grad[0, 0] = float("inf")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            for opt in opts:
                scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 2.0**7  # halved once, at the inf only the patched step saw
