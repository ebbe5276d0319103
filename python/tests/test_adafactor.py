"""torch.optim.Adafactor compiled by optjit against torch's own, in the same process: every option, f32 and f64,
factored (rank >= 2) and unfactored params, params starting at zero, with some grads None; params and every state
entry (keys, shapes, dtypes, values); a state_dict round trip both ways; kernel counts; and clipping."""

import math

import pytest
import torch

import optjit
from conftest import assert_kernels, assert_same_state, clone_params, make_params, set_grads

# Adafactor's shapes (torch refuses an empty param: the RMS of nothing).
SHAPES = [(5, 3), (6,), (2, 3, 2), (), (4, 1)]
CONFIGS = [
    dict(),
    dict(lr=0.5, weight_decay=0.1),
    dict(lr=0.01, maximize=True, weight_decay=0.1),
    dict(beta2_decay=-1.0),
    dict(d=1.5, eps=(1e-20, 1e-2)),
    dict(eps=(None, 1e-4), lr=0.05),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("options", CONFIGS, ids=lambda o: ",".join(o) or "default")
def test_adafactor_matches_torch(options, dtype):
    reference = make_params(dtype, seed=4, shapes=SHAPES)
    with torch.no_grad():
        reference[1].zero_()  # RMS(p) = 0: alpha = eps2 * rho
    ours = clone_params(reference)
    torch_opt = torch.optim.Adafactor(reference, **options)
    opt = torch.optim.Adafactor(ours, **options)
    step = optjit.compile(opt)
    for t in range(6):
        set_grads(t, reference, ours, seed=4)
        torch_opt.step()
        step()
        assert_same_state(opt, ours, torch_opt, reference, dtype)
    metrics = step.metrics()
    assert metrics["compiles"] == 1 and metrics["recompiles"] == 0
    assert_kernels(step, 4 + 2)  # the factored params' four passes, the others' two


@pytest.mark.parametrize("foreach", [None, False, True])
@pytest.mark.parametrize("first", ["bf16", "f32"])
def test_eps1_default_follows_torch_in_a_group_of_mixed_dtypes(first, foreach):
    """eps1=None is finfo(dtype).eps of the first param torch steps in the group: in its single-tensor step the first
    param with a grad, in its foreach step the first (device, dtype) group torch forms. A bf16 model keeping f32
    norms steps its f32 params with bf16's eps when a bf16 param comes first."""
    shapes = [(7,), (5, 4), (6,), (3, 2)]
    generator = torch.Generator().manual_seed(9)
    dtypes = [torch.bfloat16, torch.float32, torch.float32, torch.bfloat16]
    if first == "f32":
        dtypes = dtypes[1:] + dtypes[:1]
    reference = [torch.nn.Parameter(torch.randn(s, generator=generator).to(d)) for s, d in zip(shapes, dtypes)]
    ours = clone_params(reference)
    torch_opt = torch.optim.Adafactor(reference, lr=0.5, foreach=foreach)
    opt = torch.optim.Adafactor(ours, lr=0.5, foreach=foreach)
    step = optjit.compile(opt)
    for t in range(4):
        for a, b in zip(reference, ours):  # tiny grads: eps1 bounds the second moments
            a.grad = torch.full_like(a, 1e-4) * (1 + t)
            b.grad = a.grad.clone()
        if t == 2:
            reference[0].grad = ours[0].grad = None  # the first param steps not: the next one decides
        torch_opt.step()
        step()
    for a, b in zip(ours, reference):
        # bf16 params take several big steps, torch rounding every op and optjit once per step: a few ulp apart
        tolerance = dict(rtol=1e-5, atol=1e-6) if a.dtype == torch.float32 else dict(rtol=5e-2, atol=1e-2)
        torch.testing.assert_close(a.detach(), b.detach(), **tolerance)
    assert step.metrics()["recompiles"] == 0
    # foreach=None is torch's single-tensor step, on a GPU too: only foreach=True asks torch's grouping.
    asks_torch = optjit._torch_optim.none_option_values(torch.optim.Adafactor, opt.param_groups) is not None
    assert asks_torch == (foreach is True)


def test_row_and_column_state_in_views_with_gaps_steps_as_torch():
    """row_var and col_var replaced by views of larger buffers (load_state_dict keeps such views): stepped through
    contiguous copies, the gaps of their buffers untouched."""
    results = []
    for use_optjit in (False, True):
        generator = torch.Generator().manual_seed(0)
        p = torch.nn.Parameter(torch.randn(4, 3, generator=generator))
        opt = torch.optim.Adafactor([p], lr=0.05)
        step = optjit.compile(opt) if use_optjit else opt.step
        p.grad = torch.randn(4, 3, generator=generator)
        step()
        state = opt.state[p]
        rows, cols = torch.zeros(4, 2), torch.zeros(1, 6)
        state["row_var"] = rows[:, :1].copy_(state["row_var"])
        state["col_var"] = cols[:, ::2].copy_(state["col_var"])
        for _ in range(2):
            p.grad = torch.randn(4, 3, generator=generator)
            step()
        results.append((p.detach().clone(), rows.clone(), cols.clone()))
    for ours, theirs in zip(results[1], results[0]):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert results[1][1][:, 1].eq(0).all() and results[1][2][:, 1::2].eq(0).all()  # the gaps


def test_params_sharing_memory_are_refused():
    """torch steps params one after the other; a compiled step reads them all first: params that share elements are
    refused, interleaved ones that share none step."""
    buffer = torch.randn(6, 8)
    opt = torch.optim.Adafactor([torch.nn.Parameter(buffer[:, ::2]), torch.nn.Parameter(buffer.t()[0])], lr=0.05)
    for p in opt.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    before = buffer.clone()
    with pytest.raises(optjit.Error, match="param 0 and param 1 share memory"):
        optjit.compile(opt)()
    assert torch.equal(buffer, before)
    interleaved = [torch.nn.Parameter(buffer[:, ::2]), torch.nn.Parameter(buffer[:, 1::2])]
    reference = clone_params(interleaved)
    opt, torch_opt = torch.optim.Adafactor(interleaved, lr=0.05), torch.optim.Adafactor(reference, lr=0.05)
    for a, b in zip(interleaved, reference):
        a.grad = torch.ones_like(a)
        b.grad = torch.ones_like(b)
    optjit.compile(opt)()
    torch_opt.step()
    for a, b in zip(interleaved, reference):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)


def test_adafactor_state_dict_round_trips_both_ways():
    reference = make_params(torch.float32, seed=5, shapes=SHAPES)
    ours = clone_params(reference)
    torch_opt = torch.optim.Adafactor(reference, lr=0.05)
    opt = torch.optim.Adafactor(ours, lr=0.05)
    step = optjit.compile(opt)
    for t in range(3):
        set_grads(t, reference, ours, seed=5, none_every=0)
        torch_opt.step()
        step()
    # optjit -> torch: a plain torch Adafactor resumes from optjit's state, and torch -> optjit.
    resumed_torch = torch.optim.Adafactor(clone_params(ours), lr=0.05)
    resumed_torch.load_state_dict(opt.state_dict())
    resumed_ours = torch.optim.Adafactor(clone_params(reference), lr=0.05)
    resumed_ours.load_state_dict(torch_opt.state_dict())
    resumed_step = optjit.compile(resumed_ours)
    for t in range(3, 5):
        for params in (resumed_torch.param_groups[0]["params"], resumed_ours.param_groups[0]["params"]):
            set_grads(t, params, seed=5, none_every=0)
        resumed_torch.step()
        resumed_step()
    assert_same_state(
        resumed_ours,
        resumed_ours.param_groups[0]["params"],
        resumed_torch,
        resumed_torch.param_groups[0]["params"],
        torch.float32,
    )


def test_adafactor_with_clipping():
    reference = make_params(torch.float64, seed=6, shapes=SHAPES)
    ours = clone_params(reference)
    torch_opt = torch.optim.Adafactor(reference, lr=0.1)
    opt = torch.optim.Adafactor(ours, lr=0.1)
    step = optjit.compile(opt, max_grad_norm=0.5)
    for t in range(4):
        set_grads(t, reference, ours, seed=6)
        torch.nn.utils.clip_grad_norm_(reference, 0.5)
        torch_opt.step()
        step()
    assert_same_state(opt, ours, torch_opt, reference, torch.float64)


def test_adafactor_refuses_complex_params_as_torch_does():
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))
    p.grad = torch.ones_like(p)
    step = optjit.compile(torch.optim.Adafactor([p]))
    with pytest.raises(optjit.Error, match="Adafactor does not support complex parameters"):
        step()


def test_an_empty_param_is_refused_before_anything_steps():
    """torch divides by the RMS of an empty param's elements and raises ZeroDivisionError, after stepping the params
    before it; optjit refuses the step before any param changes or gets state."""

    def with_grads():
        params = [torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.zeros(0, 3))]
        for p in params:
            p.grad = torch.ones_like(p)
        return params

    with pytest.raises(ZeroDivisionError):
        torch.optim.Adafactor(with_grads(), lr=0.1).step()
    params = with_grads()
    opt = torch.optim.Adafactor(params, lr=0.1)
    with pytest.raises(optjit.Error, match=r"cannot step param 1 of shape \[0, 3\]: it has no elements"):
        optjit.compile(opt)()
    assert torch.equal(params[0].detach(), torch.ones(4))
    assert all(len(opt.state[p]) == 0 for p in params)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("shape", [(4,), (3, 4)], ids=["variance", "factored"])
def test_a_non_finite_grad_spreads_as_in_torch(bad, shape):
    """torch takes max(1.0, rms) with Python's max, for which a NaN rms gives 1.0, and lerps as torch.lerp does
    (inf - inf is NaN where the weight is >= 0.5): a NaN or inf in a grad spreads through params and state exactly
    as far as torch's."""
    params = [torch.nn.Parameter(torch.linspace(0.5, 2.0, 12)[: math.prod(shape)].reshape(shape))]
    reference = clone_params(params)
    opt, ref = torch.optim.Adafactor(params, lr=0.01), torch.optim.Adafactor(reference, lr=0.01)
    step = optjit.compile(opt)
    for t in range(2):
        for ps in (params, reference):
            grad = torch.linspace(-1.0, 1.0, math.prod(shape)).reshape(shape)
            grad.view(-1)[1] = bad if t == 0 else 0.5
            ps[0].grad = grad
        step()
        ref.step()
        torch.testing.assert_close(params[0].detach(), reference[0].detach(), equal_nan=True)
        for key, value in ref.state[reference[0]].items():
            torch.testing.assert_close(opt.state[params[0]][key], value, equal_nan=True, msg=key)
