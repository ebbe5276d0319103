"""Strided torch params: transposed views (the .t() of [512, 128] slices of one buffer, as in torch's Shampoo test) and
slices with gaps step in place, exactly as torch steps the same strided params, whatever layout the grads come in.
State made by torch's preserve_format shares a transposed param's layout, so those run in place; other layouts run
on contiguous copies inside the step. The buffer's memory between slices is never written."""

import pytest
import torch

import optjit
from conftest import EVERY_OPTIMIZER, assert_same_state



def _strided_params(seed, rows=24, cols=8):
    """Two transposed slices of one buffer, and every other column of a second buffer (not dense)."""
    generator = torch.Generator().manual_seed(seed)
    buffer = torch.randn(2 * rows, cols, generator=generator)
    gappy = torch.randn(6, 10, generator=generator)
    params = [torch.nn.Parameter(buffer[i * rows : (i + 1) * rows].t()) for i in range(2)]
    params.append(torch.nn.Parameter(gappy[:, ::2]))
    return params, gappy


def _grads(step, params, like_param):
    generator = torch.Generator().manual_seed(100 + step)
    grads = [torch.randn(p.shape, generator=generator) for p in params]
    # torch.empty_like keeps a dense param's layout (preserve_format): the layout autograd gives such a param's grad.
    return [torch.empty_like(p).copy_(g) if like_param else g for p, g in zip(params, grads)]


@pytest.mark.parametrize("like_param", [True, False], ids=["grads_like_params", "contiguous_grads"])
@pytest.mark.parametrize("cls,options", EVERY_OPTIMIZER, ids=lambda c: getattr(c, "__name__", ""))
def test_strided_params_step_as_torch_steps_them(cls, options, like_param):
    params, gappy = _strided_params(seed=1)
    reference, reference_gappy = _strided_params(seed=1)
    gaps = gappy[:, 1::2].clone()
    opt, torch_opt = cls(params, **options), cls(reference, foreach=False, **options)
    step = optjit.compile(opt)
    pointers = [p.data_ptr() for p in params]
    for t in range(5):
        for p, r, g in zip(params, reference, _grads(t, params, like_param)):
            p.grad, r.grad = g, g.clone()
        step()
        torch_opt.step()
        assert_same_state(opt, params, torch_opt, reference, torch.float32)
    assert [p.data_ptr() for p in params] == pointers and params[0].stride() == (1, 8)  # in place
    assert torch.equal(gappy[:, 1::2], gaps)  # the gaps between the slice's columns are never written
    assert step.metrics()["compiles"] == 1


def test_shampoo_shapes_run_in_place():
    buffer = torch.randn(4 * 512, 128)
    params = [torch.nn.Parameter(buffer[i * 512 : (i + 1) * 512].t()) for i in range(4)]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, torch_opt = torch.optim.AdamW(params, lr=0.01), torch.optim.AdamW(reference, lr=0.01, foreach=False)
    step = optjit.compile(opt)
    for t in range(3):
        for p, r, g in zip(params, reference, _grads(t, params, like_param=True)):
            p.grad, r.grad = g, g.clone()
        step()
        torch_opt.step()
    assert_same_state(opt, params, torch_opt, reference, torch.float32)
    assert all(opt.state[p]["exp_avg"].stride() == (1, 128) for p in params)  # torch's state, the param's layout


@pytest.mark.parametrize("cls,options", EVERY_OPTIMIZER, ids=lambda c: getattr(c, "__name__", ""))
def test_expanded_grads_step_as_torch_steps_them(cls, options):
    """A grad that is an expanded view (stride 0, every row the same memory) is only read: torch steps it, and so does
    optjit, through a contiguous copy."""
    generator = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(6, 5, generator=generator))]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, ref = cls(params, **options), cls(reference, **options)
    step = optjit.compile(opt)
    for t in range(3):
        row = torch.randn(5, generator=generator)
        params[0].grad = row.expand(6, 5)
        reference[0].grad = row.expand(6, 5)
        step()
        ref.step()
    assert params[0].grad.stride() == (0, 1)
    assert_same_state(opt, params, ref, reference, torch.float32)
