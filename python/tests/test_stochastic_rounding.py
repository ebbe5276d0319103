"""Stochastic rounding from Python: a param group of bf16 params with "stochastic_rounding": True (optjit's group
option) stores params and state with counter-based stochastic rounding: reproducible run to run, unbiased where
rounding to nearest is not, and refused for other dtypes."""

import pytest
import torch

import optjit

D = 2.0**-9 + 2.0**-11  # 0.325 of a bf16 ulp at 1.0


def _one_step(n=1 << 16):
    p = torch.nn.Parameter(torch.ones(n, dtype=torch.bfloat16))
    p.grad = torch.full((n,), -D, dtype=torch.bfloat16)
    opt = torch.optim.SGD([{"params": [p], "stochastic_rounding": True}], lr=1.0)
    step = optjit.compile(opt)
    step()
    assert step.metrics()["compiles"] == 1
    return p.detach().float()


def test_stochastic_rounding_is_unbiased_and_reproducible():
    first, second = _one_step(), _one_step()
    assert torch.equal(first, second)
    ulp = 2.0**-7
    assert set(first.unique().tolist()) == {1.0, 1.0 + ulp}
    p, n = D / ulp, first.numel()
    mean_error = float((first.double() - (1.0 + D)).mean())
    assert abs(mean_error) < 3 * ulp * (p * (1 - p) / n) ** 0.5  # rounding to nearest would be 0.325 ulp low


def test_stochastic_rounding_needs_bf16_params():
    p = torch.nn.Parameter(torch.ones(4))
    p.grad = torch.ones(4)
    opt = torch.optim.SGD([{"params": [p], "stochastic_rounding": True}], lr=0.1)
    with pytest.raises(optjit.Error, match="in a group with stochastic_rounding=true"):
        optjit.compile(opt)()


def _sgdm_run(steps, resume=None, start=0, param=None):
    generator = torch.Generator().manual_seed(3)
    p = torch.nn.Parameter(torch.randn(4096, generator=generator).to(torch.bfloat16) if param is None else param)
    opt = torch.optim.SGD([{"params": [p], "stochastic_rounding": True}], lr=0.01, momentum=0.9)
    if resume is not None:
        opt.load_state_dict(resume)  # before compiling: the stream's position comes with the param group
    step = optjit.compile(opt)
    for t in range(start, start + steps):
        p.grad = torch.randn(4096, generator=torch.Generator().manual_seed(50 + t)).to(torch.bfloat16)
        step()
    return p, opt


def test_a_resumed_run_continues_the_rounding_stream():
    import copy

    uninterrupted, _ = _sgdm_run(4)
    trained, first = _sgdm_run(2)
    checkpoint = copy.deepcopy(first.state_dict())
    resumed, _ = _sgdm_run(2, resume=checkpoint, start=2, param=trained.detach().clone())
    assert torch.equal(resumed, uninterrupted)  # steps 2 and 3 draw the bits they drew uninterrupted, not step 0's
