"""What optjit does not compile gets a clear optjit.Error naming it, and a bad step changes nothing."""

import pytest
import torch

import optjit
from conftest import make_params


def params():
    return make_params(torch.float32, shapes=[(3,), (2, 2)])


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda ps: torch.optim.LBFGS(ps), "optjit cannot compile LBFGS"),
        (lambda ps: torch.optim.SparseAdam(ps), "optjit cannot compile SparseAdam"),
        (lambda ps: torch.optim.Adam(ps, differentiable=True), "differentiable=True is not supported"),
    ],
)
def test_unsupported_optimizers_and_options(make, message):
    with pytest.raises(optjit.Error, match=message):
        optjit.compile(make(params()))


def test_not_an_optimizer():
    with pytest.raises(optjit.Error, match="takes a torch.optim.Optimizer, not list"):
        optjit.compile([])


def test_a_subclass_that_overrides_step():
    class Clipped(torch.optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    with pytest.raises(optjit.Error, match=r"Clipped overrides step\(\)"):
        optjit.compile(Clipped(params(), lr=0.1))


def test_a_subclass_that_keeps_step_compiles():
    class Named(torch.optim.SGD):
        pass

    ps = params()
    step = optjit.compile(Named(ps, lr=0.1))
    for p in ps:
        p.grad = torch.ones_like(p)
    step()
    assert step.metrics()["compiles"] == 1


def test_complex_params_with_fused_are_refused_as_torch_refuses_them():
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    p.grad = torch.ones_like(p)
    message = r"`fused=True` requires all the params to be floating point Tensors of supported devices"
    with pytest.raises(optjit.Error, match=message):
        optjit.compile(torch.optim.Adam([p], fused=True))()
    with pytest.raises(RuntimeError, match=message):
        torch.optim.Adam([p], fused=True).step()


def test_a_dtype_optjit_does_not_run_yet():
    with pytest.raises(optjit.Error, match="param 0 has dtype torch.float8_e4m3fn: optjit compiles torch.float32, "):
        optjit.compile(torch.optim.Adam([torch.nn.Parameter(torch.zeros(2, dtype=torch.float8_e4m3fn))]))()


def snapshot(opt, ps):
    return [p.detach().clone() for p in ps], {
        id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in ps if p in opt.state
    }


@pytest.mark.parametrize(
    "bad_grad,message",
    [
        (lambda p: torch.ones(5), "grad"),
        (lambda p: torch.ones_like(p, dtype=torch.float64), "grad"),
        (lambda p: torch.ones_like(p).to_sparse(), "not sparse ones"),
    ],
    ids=["shape", "dtype", "sparse"],
)
def test_a_bad_grad_raises_before_any_tensor_changes(bad_grad, message):
    ps = params()
    opt = torch.optim.Adam(ps, lr=0.1)
    step = optjit.compile(opt)
    for p in ps:
        p.grad = torch.ones_like(p)
    step()
    before = snapshot(opt, ps)
    ps[0].grad = torch.ones_like(ps[0])
    bad = bad_grad(ps[1])
    if bad.layout == torch.strided:
        ps[1].grad.data = bad  # torch checks `p.grad = ...`, not `p.grad.data = ...`
    else:
        ps[1].grad = bad
    with pytest.raises(optjit.Error, match=message):
        step()
    after = snapshot(opt, ps)
    for a, b in zip(before[0], after[0]):
        assert torch.equal(a, b)
    for key in before[1]:
        for k in before[1][key]:
            assert torch.equal(before[1][key][k], after[1][key][k])


def test_a_non_finite_hyperparameter_changes_nothing():
    ps = params()
    opt = torch.optim.SGD(ps, lr=0.1)
    step = optjit.compile(opt)
    for p in ps:
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in ps]
    opt.param_groups[0]["lr"] = float("nan")
    with pytest.raises(optjit.Error, match="lr"):
        step()
    for a, p in zip(before, ps):
        assert torch.equal(a, p.detach())
