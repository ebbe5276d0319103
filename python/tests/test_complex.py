"""Complex torch params (complex64, complex128): every optimizer steps them as torch does, on their real view, so
state tensors are complex too (Adagrad's sum and Rprop's step_size start at complex(v, v)) and scalar state is real.
Checked against torch's own single-tensor step on the same params, a real param in the same group, a 0-d and an
empty complex param included; then a state_dict round trip both ways."""

import copy

import pytest
import torch

import optjit
from conftest import EVERY_OPTIMIZER, assert_kernels, assert_same_state, clone_params, set_grads

SHAPES = [(4, 3), (), (0,), (7,), (2, 3, 2)]
REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _params(dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(shape, generator=generator, dtype=dtype)) for shape in SHAPES]
    params.append(torch.nn.Parameter(torch.randn(5, generator=generator, dtype=REAL_OF[dtype])))  # mixed in
    return params


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=["c64", "c128"])
@pytest.mark.parametrize("cls,options", EVERY_OPTIMIZER, ids=lambda c: getattr(c, "__name__", ""))
def test_complex_params_step_as_torch_does(cls, options, dtype):
    params = _params(dtype, seed=3)
    reference = clone_params(params)
    opt, torch_opt = cls(params, **options), cls(reference, foreach=False, **options)
    step = optjit.compile(opt)
    for t in range(6):
        set_grads(t, params, reference, seed=5)
        step()
        torch_opt.step()
        assert_same_state(opt, params, torch_opt, reference, dtype)
    for p in params:
        for key, value in opt.state[p].items():
            scalar = key in ("step", "mu_product", "eta", "mu")  # torch's scalar dtype, real
            assert value.dtype == (torch.float32 if scalar else p.dtype), f"{key}: {value.dtype}"
    metrics = step.metrics()
    assert metrics["compiles"] == 1 and metrics["recompiles"] == 0
    assert_kernels(step, 2)  # one per (device, dtype): the complex params and the real one


def test_complex_state_dict_round_trips_both_ways():
    params = _params(torch.complex64, seed=4)
    reference = clone_params(params)
    opt, torch_opt = torch.optim.Adagrad(params, lr=0.1, initial_accumulator_value=0.5), torch.optim.Adagrad(
        reference, lr=0.1, initial_accumulator_value=0.5, foreach=False
    )
    step = optjit.compile(opt)
    for t in range(3):
        set_grads(t, params, reference, seed=6)
        step()
        torch_opt.step()
    # Copies, as from a file: torch's state_dict() hands out its live tensors, and loading keeps them when dtype and
    # device already match.
    opt.load_state_dict(copy.deepcopy(torch_opt.state_dict()))  # torch's checkpoint resumes under optjit
    torch_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # and optjit's under torch
    for t in range(3, 6):
        set_grads(t, params, reference, seed=6)
        step()
        torch_opt.step()
    assert_same_state(opt, params, torch_opt, reference, torch.complex64)
    assert step.metrics()["compiles"] == 1
