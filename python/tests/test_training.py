"""optjit in a training loop: LR schedulers (no recompiles), optjit.patch (opt.step is the compiled step, hooks and
closures included), and a small MLP whose loss curve under optjit equals plain torch's."""

import copy
import weakref

import pytest
import torch

import optjit
from conftest import assert_same_state, clone_params, make_params, set_grads


def test_schedulers_change_lr_without_recompiling():
    params = make_params(torch.float32)
    reference = clone_params(params)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, amsgrad=True)
    opt_ref = torch.optim.AdamW(reference, lr=1e-3, weight_decay=0.01, amsgrad=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=40)
    sched_ref = torch.optim.lr_scheduler.OneCycleLR(opt_ref, max_lr=1e-2, total_steps=40)
    step = optjit.compile(opt)
    for t in range(30):
        set_grads(t, params, reference, none_every=0)
        step()
        opt_ref.step()
        sched.step()
        sched_ref.step()
    assert_same_state(opt, params, opt_ref, reference, torch.float32)
    metrics = step.metrics()
    assert metrics["compiles"] == 1 and metrics["recompiles"] == 0, metrics["recompile_reasons"]
    assert metrics["steps"] == 30 and metrics["kernels"] == 1


def _every_scheduler():
    lrs = torch.optim.lr_scheduler
    return {
        "LambdaLR": lambda o: lrs.LambdaLR(o, lambda e: 0.9**e),
        "MultiplicativeLR": lambda o: lrs.MultiplicativeLR(o, lambda e: 0.95),
        "StepLR": lambda o: lrs.StepLR(o, step_size=2, gamma=0.5),
        "MultiStepLR": lambda o: lrs.MultiStepLR(o, milestones=[2, 5], gamma=0.5),
        "ConstantLR": lambda o: lrs.ConstantLR(o, factor=0.5, total_iters=3),
        "LinearLR": lambda o: lrs.LinearLR(o, start_factor=0.25, total_iters=4),
        "ExponentialLR": lambda o: lrs.ExponentialLR(o, gamma=0.8),
        "PolynomialLR": lambda o: lrs.PolynomialLR(o, total_iters=6, power=2.0),
        "CosineAnnealingLR": lambda o: lrs.CosineAnnealingLR(o, T_max=5),
        "CosineAnnealingWarmRestarts": lambda o: lrs.CosineAnnealingWarmRestarts(o, T_0=3),
        "CyclicLR": lambda o: lrs.CyclicLR(o, base_lr=1e-3, max_lr=1e-2, step_size_up=2),  # cycles Adam's beta1 too
        "OneCycleLR": lambda o: lrs.OneCycleLR(o, max_lr=1e-2, total_steps=10),
        "ReduceLROnPlateau": lambda o: lrs.ReduceLROnPlateau(o, patience=0, factor=0.5),
        "SequentialLR": lambda o: lrs.SequentialLR(
            o, [lrs.ConstantLR(o, factor=0.5, total_iters=2), lrs.ExponentialLR(o, gamma=0.8)], milestones=[2]
        ),
        "ChainedScheduler": lambda o: lrs.ChainedScheduler(
            [lrs.ConstantLR(o, factor=0.5, total_iters=2), lrs.ExponentialLR(o, gamma=0.8)]
        ),
    }


@pytest.mark.parametrize("name", list(_every_scheduler()))
def test_every_lr_scheduler_steps_as_torch_without_recompiling(name):
    make = _every_scheduler()[name]
    params = make_params(torch.float32)
    reference = clone_params(params)
    opt = torch.optim.Adam(params, lr=1e-3)
    opt_ref = torch.optim.Adam(reference, lr=1e-3)
    sched, sched_ref = make(opt), make(opt_ref)
    step = optjit.compile(opt)
    for t in range(8):
        set_grads(t, params, reference, none_every=0)
        step()
        opt_ref.step()
        if name == "ReduceLROnPlateau":
            sched.step(1.0)  # never improves: the lr halves every step
            sched_ref.step(1.0)
        else:
            sched.step()
            sched_ref.step()
    assert opt.param_groups[0]["lr"] == opt_ref.param_groups[0]["lr"]
    assert_same_state(opt, params, opt_ref, reference, torch.float32)
    metrics = step.metrics()
    assert metrics["compiles"] == 1 and metrics["recompiles"] == 0, metrics["recompile_reasons"]


def test_zero_grad_frees_the_grads_a_step_read():
    """A step reads the grads and keeps none of them: zero_grad() (set_to_none, torch's default) frees their memory at
    once, as without optjit, and the next step reads the new grads (at the same addresses, often) as new ones."""
    params = make_params(torch.float32, shapes=[(64,), (3, 5)])
    reference = clone_params(params)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    opt_ref = torch.optim.SGD(reference, lr=0.1, momentum=0.9)
    step = optjit.compile(opt)
    for t in range(4):
        set_grads(t, params, reference, none_every=0)
        read = [weakref.ref(p.grad) for p in params]
        step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
        assert all(grad() is None for grad in read), "a grad outlived zero_grad()"
    assert_same_state(opt, params, opt_ref, reference, torch.float32)


def test_a_structural_change_recompiles_and_says_why():
    params = make_params(torch.float32)
    opt = torch.optim.Adam(params, lr=1e-3)
    step = optjit.compile(opt)
    set_grads(0, params)
    step()
    opt.param_groups[0]["amsgrad"] = True
    opt.state.clear()  # amsgrad keeps one more state entry; torch would need it too
    set_grads(1, params)
    step()
    reasons = step.metrics()["recompile_reasons"]
    assert len(reasons) == 1 and "amsgrad" in reasons[0]


def test_patch_runs_hooks_and_closures_and_unpatch_restores_torch():
    params = make_params(torch.float32, shapes=[(3,), (2,)])
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
    compiled = optjit.patch(opt)

    def closure():
        calls.append("closure")
        for p in params:
            p.grad = torch.ones_like(p)
        return torch.tensor(2.0)

    loss = opt.step(closure)
    assert float(loss) == 2.0 and calls == ["pre", "closure", "post"]
    assert compiled.metrics()["steps"] == 1
    opt.zero_grad(set_to_none=False)  # the same grad tensors, zeroed: a step moves params by momentum alone
    before = [p.detach().clone() for p in params]
    opt.step()
    assert all(not torch.equal(b, p.detach()) for b, p in zip(before, params))
    optjit.unpatch(opt)
    assert "step" not in vars(opt)
    with pytest.raises(optjit.Error, match="not patched"):
        optjit.unpatch(opt)


def test_add_param_group_joins_the_compiled_step():
    params = make_params(torch.float32, shapes=[(3,), (2,)])
    extra = make_params(torch.float32, seed=1, shapes=[(4,)])
    reference, extra_ref = clone_params(params), clone_params(extra)
    opt, opt_ref = torch.optim.Adam(params, lr=0.01), torch.optim.Adam(reference, lr=0.01)
    step = optjit.compile(opt)
    for t in range(2):
        set_grads(t, params, reference, none_every=0)
        step()
        opt_ref.step()
    opt.add_param_group({"params": extra, "lr": 0.1})
    opt_ref.add_param_group({"params": extra_ref, "lr": 0.1})
    for t in range(2, 5):
        set_grads(t, params + extra, reference + extra_ref, none_every=0)
        step()
        opt_ref.step()
    assert_same_state(opt, params + extra, opt_ref, reference + extra_ref, torch.float32)
    assert "param groups changed" in step.metrics()["recompile_reasons"][-1]


def test_a_small_mlp_trains_the_same_under_optjit_patch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    model_ref = copy.deepcopy(model)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.Adam(model_ref.parameters(), lr=1e-2)
    optjit.patch(opt)
    losses, losses_ref = [], []
    for _ in range(200):
        for m, o, record in ((model, opt, losses), (model_ref, opt_ref, losses_ref)):
            o.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            o.step()
            record.append(loss.item())
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(losses_ref), rtol=1e-4, atol=1e-6)
    assert losses[-1] < 0.5 * losses[0]
    assert opt.step.compiled.metrics()["compiles"] == 1
