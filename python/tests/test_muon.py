"""torch.optim.Muon compiled (optjit.compile, optjit.patch) against torch's own step in the same process: the momentum
equal to torch's, the params within the spread of bf16 rounding (the Newton-Schulz products run in bf16 in both,
in different libraries' summation orders), tall, wide, square and 1xN matrices, every option, param groups, one
compile however lr changes, state dicts both ways, and torch's errors with nothing changed."""

import pytest
import torch

import optjit

pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")

SHAPES = [(12, 5), (5, 12), (8, 8), (1, 9), (16, 6)]


def _params(seed, shapes=SHAPES, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g, dtype=torch.float64).to(dtype)) for s in shapes]


def _grads(step, shapes=SHAPES, dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) * (0.5 + step % 3) for s in shapes]


def _bf16_bound(lr, shapes=SHAPES):
    """How far apart two bf16 Newton-Schulz implementations may put a param after a step: a few bf16 ulps of the
    update, whose elements are at most ~1 times the adjusted lr (at most lr * 0.2 * sqrt(16) or lr * sqrt(16 / 6))."""
    return 2 ** -5 * lr * 4


def _step_both(t, torch_opt, reference, step, ours):
    """Step t of torch's optimizer over `reference` and of optjit's `step` over `ours`, with the same grads."""
    for p, q, g in zip(reference, ours, _grads(t)):
        p.grad, q.grad = g.clone(), g.clone()
    torch_opt.step()
    step()


def _run(options, steps=5, groups=None, lr_schedule=None):
    reference, ours = _params(7), _params(7)
    spec = (lambda ps: [{"params": ps[i:j], **o} for (i, j), o in groups]) if groups else (lambda ps: ps)
    torch_opt = torch.optim.Muon(spec(reference), **options)
    opt = torch.optim.Muon(spec(ours), **options)
    step = optjit.compile(opt)
    for t in range(steps):
        if lr_schedule:
            for o in (torch_opt, opt):
                for group in o.param_groups:
                    group["lr"] = lr_schedule(t)
        _step_both(t, torch_opt, reference, step, ours)
        for p, q in zip(reference, ours):
            assert torch.equal(torch_opt.state[p]["momentum_buffer"], opt.state[q]["momentum_buffer"])
    return reference, ours, torch_opt, opt, step


@pytest.mark.parametrize(
    "options",
    [
        dict(lr=0.02),
        dict(lr=0.02, nesterov=False, momentum=0.9, weight_decay=0.0),
        dict(lr=0.01, adjust_lr_fn="match_rms_adamw", weight_decay=0.05),
        dict(lr=0.01, adjust_lr_fn="spectral_unclamped"),
        dict(lr=0.03, adjust_lr_fn="original", ns_coefficients=(3.0, -3.2, 1.2), ns_steps=3, eps=1e-5),
        dict(lr=0.05, momentum=0.0, ns_steps=0),
    ],
    ids=["defaults", "plain_momentum", "match_rms_adamw", "spectral_unclamped", "coefficients", "no_iterations"],
)
def test_muon_matches_torch(options):
    reference, ours, _, _, step = _run(options)
    for p, q in zip(reference, ours):
        torch.testing.assert_close(q, p, rtol=0, atol=_bf16_bound(options["lr"]) * 5)
    assert step.metrics()["compiles"] == 1
    # Two buckets (tall matrices apart), each with three products per iteration in the matrix library.
    assert step.metrics()["library_calls"] == step.library_call_count == 2 * 3 * options.get("ns_steps", 5)


def test_muon_groups_and_a_changing_lr_compile_once():
    groups = [((0, 2), {}), ((2, 5), {"lr": 0.005, "weight_decay": 0.3, "adjust_lr_fn": "match_rms_adamw"})]
    reference, ours, _, _, step = _run(dict(lr=0.02), steps=6, groups=groups, lr_schedule=lambda t: 0.02 / (1 + t))
    for p, q in zip(reference, ours):
        torch.testing.assert_close(q, p, rtol=0, atol=_bf16_bound(0.02) * 6)
    assert step.metrics()["compiles"] == 1
    assert step.metrics()["recompiles"] == 0


def test_muon_state_dicts_move_between_torch_and_optjit():
    reference, ours, torch_opt, opt, step = _run(dict(lr=0.02), steps=2)
    # optjit's state into torch's optimizer, and on: the next steps agree as before
    fresh = torch.optim.Muon(reference, lr=0.02)
    fresh.load_state_dict(opt.state_dict())
    for p, q in zip(reference, ours):
        assert torch.equal(fresh.state[p]["momentum_buffer"], opt.state[q]["momentum_buffer"])
        p.data.copy_(q.data)
    for t in range(2, 4):
        _step_both(t, fresh, reference, step, ours)
    for p, q in zip(reference, ours):
        assert torch.equal(fresh.state[p]["momentum_buffer"], opt.state[q]["momentum_buffer"])
        torch.testing.assert_close(q, p, rtol=0, atol=_bf16_bound(0.02) * 3)


def test_muon_patch_steps_in_place():
    params = _params(3)
    opt = torch.optim.Muon(params, lr=0.02)
    optjit.patch(opt)
    before = [p.detach().clone() for p in params]
    for p, g in zip(params, _grads(0)):
        p.grad = g
    opt.step()
    assert all(not torch.equal(p, b) for p, b in zip(params, before))
    assert set(opt.state[params[0]]) == {"momentum_buffer"}


def test_muon_errors_are_torchs_with_nothing_changed():
    params = _params(5, shapes=[(4, 3)])
    opt = torch.optim.Muon(params, lr=0.02)
    step = optjit.compile(opt)
    params[0].grad = torch.ones(4, 3)
    before = params[0].detach().clone()
    opt.param_groups[0]["ns_steps"] = 100
    with pytest.raises(ValueError, match="Number of steps must be less than 100"):
        step()
    opt.param_groups[0]["ns_steps"] = 5
    opt.param_groups[0]["ns_coefficients"] = (1.0, 2.0)
    with pytest.raises(ValueError, match="Coefficients must be a tuple of exactly 3 values"):
        step()
    assert torch.equal(params[0], before)
    assert not opt.state[params[0]]
    # A matrix without columns: torch's adjust_lr_fn divides by them (after stepping the params before it); here
    # before anything changes. match_rms_adamw divides by nothing, and steps it (an empty update).
    opt.param_groups[0]["ns_coefficients"] = (3.4445, -4.7750, 2.0315)
    empty = torch.nn.Parameter(torch.zeros(3, 0))
    empty.grad = torch.zeros(3, 0)
    opt.add_param_group({"params": [empty]})
    with pytest.raises(ZeroDivisionError, match="divides its rows by its columns"):
        step()
    assert torch.equal(params[0], before)
    opt.param_groups[1]["adjust_lr_fn"] = "match_rms_adamw"
    step()
    assert not torch.equal(params[0], before)


def _f32_muon_step(p, g, lr, momentum=0.95, weight_decay=0.1, coefficients=(3.4445, -4.7750, 2.0315), steps=5):
    """torch's Muon step from a zero momentum buffer, with the normalization and iterations in f64 (torch's
    algorithm without its bf16 roundings): what f32 iterations approach within f32 rounding."""
    buf = torch.zeros_like(g).lerp_(g, 1 - momentum)
    u = g.lerp(buf, momentum).double()
    x = u / u.norm().clamp(min=1e-7)
    tall = x.size(0) > x.size(1)
    x = x.T if tall else x
    a, b, c = coefficients
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    x = x.T if tall else x
    adjusted = lr * max(1, p.size(0) / p.size(1)) ** 0.5
    return (p.double() * (1 - lr * weight_decay) - adjusted * x).float()


def test_muon_f32_iterations_group_option():
    params = _params(3)
    grads = [torch.randn(s, generator=torch.Generator().manual_seed(i), dtype=torch.float32) for i, s in enumerate(SHAPES)]
    exact = [_f32_muon_step(p.detach(), g, 0.02) for p, g in zip(params, grads)]
    bf16 = torch.optim.Muon([p.detach().clone().requires_grad_() for p in params], lr=0.02)
    for q, g in zip(bf16.param_groups[0]["params"], grads):
        q.grad = g.clone()
    bf16.step()
    opt = torch.optim.Muon(params, lr=0.02)
    opt.param_groups[0]["f32_iterations"] = True  # optjit's own group option; torch's step would ignore it
    for p, g in zip(params, grads):
        p.grad = g.clone()
    step = optjit.compile(opt)
    step()
    for p, q, e in zip(params, bf16.param_groups[0]["params"], exact):
        update = 0.02 * 4  # the largest adjusted lr times an update element near 1
        assert (p.detach() - e).abs().max() < 1e-5 * update  # f32 rounding of the update
        assert (q.detach() - e).abs().max() > 1e-4 * update  # torch's bf16 iterations: bf16 rounding
    assert step.metrics()["compiles"] == 1
    opt.param_groups[0]["f32_iterations"] = False  # bf16 again: another program
    step()
    assert step.metrics()["compiles"] == 2
