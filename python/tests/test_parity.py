"""optjit.compile(opt) against torch's own step in the same process, on torch's configuration database (optim_db:
the configurations PyTorch's compiled-optimizer tests iterate), every CPU configuration of the 11 optimizers and of
Adafactor, f32 and f64, several shapes (0-d and empty included), some grads None, 6 steps."""

import pytest
import torch
from torch.testing._internal.common_optimizers import optim_db

import optjit
from conftest import SHAPES, assert_kernels, assert_same_state, clone_params, make_params, set_grads

COMPILED = {
    "Adam", "AdamW", "SGD", "NAdam", "RAdam", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "ASGD", "Adafactor"
}


def configurations():
    for info in optim_db:
        name = info.optim_cls.__name__
        if name not in COMPILED:
            continue
        for dtype in (torch.float32, torch.float64):
            for index, config in enumerate(info.optim_inputs_func(device="cpu", dtype=dtype)):
                tag = f"{name}-{config.desc}-{str(dtype)[6:]}".replace(" ", "_")
                yield pytest.param(info.optim_cls, config.kwargs, dtype, id=tag)


@pytest.mark.parametrize("cls,kwargs,dtype", list(configurations()))
def test_compiled_step_matches_torch(cls, kwargs, dtype):
    # torch's Adafactor divides by sqrt(numel) on the host: an empty param raises ZeroDivisionError there.
    shapes = [s for s in SHAPES if 0 not in s] if cls is torch.optim.Adafactor else SHAPES
    params = make_params(dtype, shapes=shapes)
    reference = clone_params(params)
    kwargs_a = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    opt = cls(params, **kwargs_a)
    opt_ref = cls(reference, **kwargs)
    step = optjit.compile(opt)
    for t in range(6):
        set_grads(t, params, reference)
        step()
        opt_ref.step()
        assert_same_state(opt, params, opt_ref, reference, dtype)
    metrics = step.metrics()
    assert metrics["compiles"] == 1, metrics["recompile_reasons"]
    # Adafactor: its factored params (rank >= 2) in four kernels, the others in two (row and column means, RMS norms).
    assert_kernels(step, (4 + 2 if cls is torch.optim.Adafactor else 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_param_groups_with_their_own_options(dtype):
    params = make_params(dtype)
    reference = clone_params(params)

    def groups(ps):
        return [{"params": ps[:2], "lr": 0.1, "amsgrad": True}, {"params": ps[2:], "weight_decay": 0.5}]

    opt, opt_ref = torch.optim.AdamW(groups(params), lr=0.01), torch.optim.AdamW(groups(reference), lr=0.01)
    step = optjit.compile(opt)
    for t in range(5):
        set_grads(t, params, reference)
        step()
        opt_ref.step()
    assert_same_state(opt, params, opt_ref, reference, dtype)
    assert_kernels(step, 2)  # one kernel per group structure


def test_state_torch_makes_from_the_grad_and_a_step_without_state():
    # SGD's momentum_buffer (clone(grad)) and Rprop's step_size (full_like(grad)) take the grad's layout; SGD without
    # momentum makes no state entry at all.
    for cls, kwargs in ((torch.optim.SGD, dict(lr=0.1, momentum=0.9)), (torch.optim.Rprop, dict(lr=0.01))):
        ours = torch.nn.Parameter(torch.randn(7, 5).t())  # a transposed param, given a contiguous grad
        theirs = torch.nn.Parameter(ours.detach().clone())
        ours.grad, theirs.grad = torch.randn(5, 7), None
        theirs.grad = ours.grad.clone()
        opt, ref = cls([ours], **kwargs), cls([theirs], **kwargs)
        optjit.compile(opt)()
        ref.step()
        for key, value in ref.state[theirs].items():
            assert opt.state[ours][key].stride() == value.stride(), f"{cls.__name__} {key}"
            torch.testing.assert_close(opt.state[ours][key], value)
    p = torch.nn.Parameter(torch.randn(3))
    p.grad = torch.randn(3)
    opt = torch.optim.SGD([p], lr=0.1)
    optjit.compile(opt)()
    assert len(opt.state) == 0 and opt.state_dict()["state"] == {}


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax])
def test_an_inf_grad_spreads_as_in_torch(cls):
    # torch's first moment is a lerp: inf + w * (g - inf) is NaN on the step after an inf grad.
    ours = torch.nn.Parameter(torch.zeros(2))
    theirs = torch.nn.Parameter(torch.zeros(2))
    opt, ref = cls([ours], lr=0.01), cls([theirs], lr=0.01)
    step = optjit.compile(opt)
    for grad in ([1.0, float("inf")], [1.0, 1.0]):
        ours.grad, theirs.grad = torch.tensor(grad), torch.tensor(grad)
        step()
        ref.step()
    torch.testing.assert_close(ours, theirs, equal_nan=True)
    for key, value in ref.state[theirs].items():
        torch.testing.assert_close(opt.state[ours][key], value, equal_nan=True)


@pytest.mark.parametrize(
    "cls, options",
    [
        (torch.optim.Adam, {}),
        (torch.optim.AdamW, dict(weight_decay=0.1)),
        (torch.optim.Adam, dict(amsgrad=True)),
        (torch.optim.Adamax, {}),
        (torch.optim.NAdam, {}),
        (torch.optim.NAdam, dict(decoupled_weight_decay=True, weight_decay=0.1)),
    ],
    ids=["Adam", "AdamW", "Adam amsgrad", "Adamax", "NAdam", "NAdam decoupled"],
)
def test_an_f32_tensor_lr_over_f64_params_follows_torchs_f32_arithmetic(cls, options):
    """torch computes lr / bias_correction1 and 1 - lr * weight_decay as f32 tensors when lr is one: the steps it
    takes are those f32 values, which a computation in f64 misses by ~1e-9. (ASGD's eta, an f32 power, still differs
    by ~2e-9.)"""
    params = make_params(torch.float64)
    twin = clone_params(params)
    opt, reference = cls(params, lr=torch.tensor(0.01), **options), cls(twin, lr=torch.tensor(0.01), **options)
    step = optjit.compile(opt)
    for s in range(8):
        set_grads(s, params, twin)
        step()
        reference.step()
    for p, q in zip(params, twin):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-15, atol=1e-16)
