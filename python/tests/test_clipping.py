"""Grad-norm clipping fused into the compiled step: optjit.compile(opt, max_grad_norm=...) against
torch.nn.utils.clip_grad_norm_ followed by torch's own step, for every optimizer, both norm types, f32 and f64, over
several param groups: params, state and the total norm agree, the grads are never written, Adam + clipping is two
kernels, and error_if_nonfinite refuses a step before anything changes."""

import pytest
import torch

import optjit
from conftest import (
    EVERY_OPTIMIZER,
    assert_close,
    assert_kernels,
    assert_same_state,
    clone_params,
    make_params,
    set_grads,
)

NORMS = [2.0, float("inf")]
# Shapes without an empty tensor: torch refuses the inf norm of one.
SHAPES = [(4, 3), (), (7,), (2, 3, 2)]


def _groups(params, options):
    return [{"params": params[:2]}, {"params": params[2:], "lr": options["lr"] * 0.5}]


@pytest.mark.parametrize("norm_type", NORMS, ids=["l2", "inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("cls,options", EVERY_OPTIMIZER, ids=lambda c: getattr(c, "__name__", ""))
def test_clipping_matches_clip_grad_norm_then_step(cls, options, dtype, norm_type):
    reference = make_params(dtype, seed=3, shapes=SHAPES)
    ours = clone_params(reference)
    torch_opt = cls(_groups(reference, options), **options)
    opt = cls(_groups(ours, options), **options)
    step = optjit.compile(opt, max_grad_norm=1.5, norm_type=norm_type)
    for t in range(6):
        set_grads(t, reference, ours, seed=3, none_every=4)
        scale = (0.1, 3.0, 0.5, 10.0, 0.01, 2.0)[t]  # clipping active on some steps, not on others
        for p in reference + ours:
            if p.grad is not None:
                p.grad.mul_(scale)
        grads_before = [None if p.grad is None else p.grad.clone() for p in ours]
        expected_norm = torch.nn.utils.clip_grad_norm_(reference, 1.5, norm_type=norm_type)
        torch_opt.step()
        step()
        assert step.total_norm.dtype == expected_norm.dtype  # clip_grad_norm_'s: the grads' dtype
        assert_close(step.total_norm, expected_norm, dtype, f"step {t} total_norm")
        for i, (p, q) in enumerate(zip(ours, reference)):
            assert_close(p.detach(), q.detach(), dtype, f"step {t} param {i}")
            if grads_before[i] is not None:
                assert torch.equal(p.grad, grads_before[i]), f"step {t}: the grad of param {i} was written"
        assert_same_state(opt, ours, torch_opt, reference, dtype)
    assert step.metrics()["compiles"] == 1


def test_adam_with_clipping_is_two_kernels_and_patch_takes_it():
    params = make_params(torch.float32, shapes=SHAPES)
    opt = torch.optim.Adam(params, lr=0.01)
    compiled = optjit.patch(opt, max_grad_norm=1.0)
    set_grads(0, params, none_every=0)
    opt.step()
    assert_kernels(compiled, 2)  # the norm pass, then Adam
    assert compiled.total_norm is not None
    assert optjit.compile(torch.optim.Adam(params), max_grad_norm=None).total_norm is None
    optjit.unpatch(opt)


def test_error_if_nonfinite_changes_nothing():
    params = make_params(torch.float32, shapes=SHAPES)
    opt = torch.optim.Adam(params, lr=0.01)
    step = optjit.compile(opt, max_grad_norm=1.0, error_if_nonfinite=True)
    set_grads(0, params, none_every=0)
    step()
    before = [p.detach().clone() for p in params]
    state_before = {k: v.clone() for k, v in opt.state[params[0]].items()}
    params[2].grad[3] = float("nan")
    with pytest.raises(optjit.Error, match="is non-finite, so it cannot be clipped"):
        step()
    for p, b in zip(params, before):
        assert torch.equal(p.detach(), b)
    for k, v in opt.state[params[0]].items():
        assert torch.equal(v, state_before[k]), k


def test_a_refused_first_step_leaves_no_state():
    params = make_params(torch.float32, shapes=SHAPES)
    opt = torch.optim.Adam(params, lr=0.01)
    step = optjit.compile(opt, max_grad_norm=1.0, error_if_nonfinite=True)
    set_grads(0, params, none_every=0)
    params[0].grad[0, 0] = float("inf")
    before = [p.detach().clone() for p in params]
    with pytest.raises(optjit.Error, match="is non-finite"):
        step()
    assert all(len(opt.state[p]) == 0 for p in params)
    for p, b in zip(params, before):
        assert torch.equal(p.detach(), b)
    params[0].grad[0, 0] = 0.5
    step()  # the next step is the first, and runs
    assert opt.state[params[0]]["step"].item() == 1


@pytest.mark.parametrize(
    "max_norm", [float("inf"), -0.5, torch.tensor(float("inf"))], ids=["inf", "negative", "tensor"]
)
def test_any_max_norm_as_clip_grad_norm_takes_it(max_norm):
    """An infinite max_norm clips nothing and only measures the norm (a common way to log it); a negative one gives a
    negative coefficient. Both as clip_grad_norm_."""
    reference = make_params(torch.float32, seed=4, shapes=SHAPES)
    ours = clone_params(reference)
    torch_opt = torch.optim.Adam(reference, lr=0.01)
    step = optjit.compile(torch.optim.Adam(ours, lr=0.01), max_grad_norm=max_norm)
    for t in range(3):
        set_grads(t, reference, ours, seed=4, none_every=0)
        expected = torch.nn.utils.clip_grad_norm_(reference, max_norm)
        torch_opt.step()
        step()
        assert_close(step.total_norm, expected, torch.float32, f"step {t} total_norm")
        for i, (p, q) in enumerate(zip(ours, reference)):
            assert_close(p.detach(), q.detach(), torch.float32, f"step {t} param {i}")


def test_total_norm_without_grads_is_clip_grad_norm_s_zero():
    params = make_params(torch.float64, shapes=SHAPES)
    step = optjit.compile(torch.optim.SGD(params, lr=0.1), max_grad_norm=1.0)
    step()  # no param has a grad
    expected = torch.nn.utils.clip_grad_norm_(params, 1.0)
    assert step.total_norm.dtype == expected.dtype and step.total_norm.device == expected.device
    assert step.total_norm.item() == expected.item() == 0.0


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(max_grad_norm="big"), "max_grad_norm is 'big', not a number"),
        (dict(max_grad_norm=1.0, norm_type=1), "norm_type is 1: fused clipping takes 2 or inf"),
    ],
)
def test_bad_clipping_arguments(kwargs, message):
    opt = torch.optim.SGD(make_params(torch.float32), lr=0.1)
    with pytest.raises(optjit.Error, match=message):
        optjit.compile(opt, **kwargs)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_clipping_over_mixed_dtypes_takes_each_norm_in_its_grads_dtype_as_torch(low):
    """clip_grad_norm_ takes each dtype's norms with _foreach_norm, in that dtype (a bf16 grad's norm is a bf16
    number), then stacks them: optjit rounds each tensor's norm alike, so the f32 and f64 params follow torch's to
    their own precision over several steps, not to bf16's. (SGD: torch's own f16 Adam overflows where optjit's,
    computed in f32, does not.)"""
    generator = torch.Generator().manual_seed(5)
    dtypes = [torch.float32, low, torch.float64, low, torch.float32]
    reference = [torch.nn.Parameter(torch.randn(37 + k, generator=generator).to(d)) for k, d in enumerate(dtypes)]
    ours = clone_params(reference)
    torch_opt = torch.optim.SGD(reference, lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(ours, lr=0.1, momentum=0.9)
    step = optjit.compile(opt, max_grad_norm=1.0)
    for t in range(5):
        for p, q in zip(reference, ours):
            p.grad = (3 * torch.randn(p.shape, generator=generator)).to(p.dtype)
            q.grad = p.grad.clone()
        expected = torch.nn.utils.clip_grad_norm_(reference, 1.0)
        torch_opt.step()
        step()
        torch.testing.assert_close(step.total_norm, expected, rtol=1e-6, atol=0)
        for i, (p, q) in enumerate(zip(ours, reference)):
            if p.dtype in (torch.float32, torch.float64):
                assert_close(p.detach(), q.detach(), torch.float32, f"step {t} param {i}")
            else:
                torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-2, atol=1e-2)


def test_total_norm_is_nan_for_a_nan_grad_and_for_a_skipped_step():
    p = torch.nn.Parameter(torch.zeros(3))
    step = optjit.compile(torch.optim.SGD([p], lr=0.1), max_grad_norm=1.0)
    assert step.total_norm is None  # no clipped step yet
    p.grad = torch.tensor([3.0, 4.0, 0.0])
    step()
    assert step.total_norm.item() == 5.0
    p.grad = torch.tensor([1.0, float("nan"), 2.0])
    step()
    assert step.total_norm.isnan()  # clip_grad_norm_'s value, not "no step yet"
    p.grad = torch.tensor([3.0, 4.0, 0.0])
    opt = step._opt
    opt.grad_scale, opt.found_inf = torch.ones(()), torch.ones(())  # GradScaler found an inf: the step is skipped
    step()
    assert step.total_norm.isnan()  # not the last step's 5.0
