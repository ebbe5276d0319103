"""Shared helpers of the Python package's tests: params and grads made the same way for torch and for optjit, and
comparisons at the golden tolerances (../../tests/golden: f32 rtol 1e-5, atol 1e-6; f64 rtol 1e-10, atol 1e-13)."""

import torch

TOLERANCES = {torch.float32: (1e-5, 1e-6), torch.float64: (1e-10, 1e-13)}
TOLERANCES.update({torch.complex64: TOLERANCES[torch.float32], torch.complex128: TOLERANCES[torch.float64]})

# One configuration per torch.optim optimizer, with the options that change its math (maximize, weight decay, ...).
EVERY_OPTIMIZER = [
    (torch.optim.Adam, dict(lr=0.05, amsgrad=True, weight_decay=0.1)),
    (torch.optim.AdamW, dict(lr=0.05, maximize=True)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (torch.optim.NAdam, dict(lr=0.05, decoupled_weight_decay=True, weight_decay=0.1)),
    (torch.optim.RAdam, dict(lr=0.05, weight_decay=0.1)),
    (torch.optim.Adamax, dict(lr=0.05, maximize=True)),
    (torch.optim.Adagrad, dict(lr=0.1, initial_accumulator_value=0.1, lr_decay=0.01)),
    (torch.optim.Adadelta, dict(lr=1.0, weight_decay=0.1)),
    (torch.optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.5)),
    (torch.optim.Rprop, dict(lr=0.01)),
    (torch.optim.ASGD, dict(lr=0.05, t0=2)),
]

# Several shapes, a 0-d and an empty one included.
SHAPES = [(4, 3), (), (0,), (7,), (2, 3, 2)]


def lion_update(params, grads, exp_avgs, *, lr, beta1, beta2, weight_decay):
    """Lion written with torch's foreach calls, to compile with optjit.step_function (each test its own)."""
    update = torch._foreach_lerp(exp_avgs, grads, 1 - beta1)
    torch._foreach_sign_(update)
    torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_add_(params, update, alpha=-lr)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta2)


def make_params(dtype, seed=0, shapes=SHAPES):
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator, dtype=dtype)) for shape in shapes]


def clone_params(params):
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def set_grads(step, *param_lists, seed=0, none_every=3):
    """The same grads on every list: random, with the grad of one param None on some steps."""
    generator = torch.Generator().manual_seed(1000 * seed + step)
    reference = param_lists[0]
    grads = [torch.randn(p.shape, generator=generator, dtype=p.dtype) for p in reference]
    for i, g in enumerate(grads):
        none = none_every and (step + i) % none_every == 0 and step > 0
        for params in param_lists:
            params[i].grad = None if none else g.clone()


def assert_kernels(step, expected):
    """`step` (a compiled step or step function) launches `expected` kernels; the fused plan is the message if not."""
    count = step.kernel_count
    assert count == expected, f"{count} kernels, not {expected}; the plan:\n{step.dump('fused')}"


def assert_close(actual, expected, dtype, what):
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def assert_same_state(opt_a, params_a, opt_b, params_b, dtype):
    """Params and every state entry (keys, dtypes and values) of two optimizers agree."""
    for i, (a, b) in enumerate(zip(params_a, params_b)):
        assert_close(a.detach(), b.detach(), dtype, f"param {i}")
        state_a, state_b = opt_a.state.get(a, {}), opt_b.state.get(b, {})
        assert list(state_a) == list(state_b), f"param {i}: state keys {list(state_a)} vs {list(state_b)}"
        for key in state_a:
            va, vb = state_a[key], state_b[key]
            if isinstance(vb, torch.Tensor):
                assert va.dtype == vb.dtype and va.shape == vb.shape, f"param {i} state {key}: {va} vs {vb}"
                assert_close(va, vb, dtype if va.dtype == dtype else va.dtype, f"param {i} state {key}")
            else:
                assert va == vb, f"param {i} state {key}: {va} vs {vb}"
