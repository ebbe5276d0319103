"""@optjit.step_function: steps written with torch's own foreach calls, recorded on symbolic lists and compiled.
Each runs compiled in place and agrees with the same function run eagerly by torch (fn.eager) on copies: a Lion, a
foreach_map-style Adam against torch.optim.Adam, a LAMB-like step with torch._foreach_norm (two kernels), and the
Shampoo seed's layout (.t() views of one buffer). Steps written one tensor at a time (a loop of tensor methods, torch's
own foreach_map Adam recipe) record the same programs. An op outside the vocabulary is an optjit.Error naming it."""

import copy
import weakref

import pytest
import torch

import optjit
from conftest import assert_close, assert_kernels, lion_update


def _lists(dtype, seed, count, shapes=((33, 7), (5,), (4, 4, 3))):
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=generator, dtype=dtype) for s in shapes] for _ in range(count)]


def _clone(lists):
    return [[t.clone() for t in lst] for lst in lists]


lion = optjit.step_function(lion_update, name="lion")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_lion_is_one_kernel_and_follows_torch(dtype):
    ours = _lists(dtype, 1, 3)
    reference = _clone(ours)
    for step in range(4):
        hypers = dict(lr=1e-2 * (step + 1), beta1=0.9, beta2=0.99, weight_decay=0.1)
        lion(*ours, **hypers)
        lion.eager(*reference, **hypers)
        for lst, ref, what in zip(ours, reference, ("params", "grads", "exp_avgs")):
            for k, (a, b) in enumerate(zip(lst, ref)):
                assert_close(a, b, dtype, f"step {step} {what}[{k}]")
    assert_kernels(lion, 1)
    assert lion._cxx.compiles() == 1  # new lrs never recompile


def test_foreach_map_style_adam_matches_torch_optim_adam():
    @optjit.step_function
    def adam_step(params, grads, exp_avgs, exp_avg_sqs, *, lr, beta1, beta2, eps, bias1, bias2):
        # torch's _multi_tensor_adam with the bias corrections as hyperparameters (their step powers are host math)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bias2**0.5)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, -lr / bias1)

    torch.manual_seed(0)
    params = [torch.randn(s) for s in ((33, 7), (5,), ())]
    reference = [torch.nn.Parameter(p.clone()) for p in params]
    opt = torch.optim.Adam(reference, lr=0.01, foreach=True)
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    for step in range(1, 6):
        grads = [torch.randn(p.shape) for p in params]
        for r, g in zip(reference, grads):
            r.grad = g.clone()
        opt.step()
        adam_step(params, grads, exp_avgs, exp_avg_sqs, lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8,
                  bias1=1 - 0.9**step, bias2=1 - 0.999**step)
        for k, (a, b) in enumerate(zip(params, reference)):
            assert_close(a, b.detach(), torch.float32, f"step {step} param {k}")
    assert_kernels(adam_step, 1)


def test_norms_split_the_step_into_two_kernels():
    @optjit.step_function
    def normalized(params, grads, *, lr):
        norms = torch._foreach_norm(grads)
        scaled = torch._foreach_div(grads, norms)
        torch._foreach_add_(params, scaled, alpha=-lr)

    ours = _lists(torch.float64, 2, 2)
    reference = _clone(ours)
    normalized(*ours, lr=0.5)
    normalized.eager(*reference, lr=0.5)
    for a, b in zip(ours[0], reference[0]):
        assert_close(a, b, torch.float64, "params")
    assert_kernels(normalized, 2)  # the norms' pass, then the update


def test_shampoo_layout_transposed_views_of_one_buffer():
    @optjit.step_function
    def momentum(params, grads, bufs, *, lr, beta):
        torch._foreach_mul_(bufs, beta)
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-lr)

    buffer = torch.randn(4 * 512 * 128)
    params = [buffer[k * 512 * 128 : (k + 1) * 512 * 128].view(512, 128).t() for k in range(4)]
    grads = [torch.randn(128, 512).t().contiguous().t() for _ in range(4)]
    bufs = [torch.zeros_like(p) for p in params]
    expected = [p.clone() for p in params]
    momentum(params, grads, bufs, lr=0.1, beta=0.9)
    for p, e, g in zip(params, expected, grads):
        assert_close(p, e - 0.1 * g, torch.float32, "param")
    assert params[0].data_ptr() == buffer.data_ptr()  # in place, in the buffer


def test_per_tensor_numbers_are_a_list_of_0d_tensors():
    """A list of different Python numbers, one per tensor, is refused with the form that records it: 0-d tensors in a
    list beside the state lists, which the compiled step reads per tensor."""

    @optjit.step_function
    def numbers(params, grads, *, lr):
        torch._foreach_add_(params, torch._foreach_mul(grads, [0.5, 0.25, 2.0]), alpha=-lr)

    with pytest.raises(optjit.Error, match="pass per-tensor numbers as a list of 0-d tensors"):
        numbers(*_lists(torch.float32, 3, 2), lr=0.1)

    @optjit.step_function
    def scaled(params, grads, scales, *, lr):
        torch._foreach_add_(params, torch._foreach_mul(grads, scales), alpha=-lr)

    params, grads = _lists(torch.float32, 3, 2)
    eager = _clone([params])[0]
    scales = [torch.tensor(0.5), torch.tensor(0.25), torch.tensor(2.0)]
    scaled(params, grads, scales, lr=0.1)
    scaled.eager(eager, grads, scales, lr=0.1)
    for a, b in zip(params, eager):
        assert_close(a, b, torch.float32, "param")


@optjit.step_function
def _adamw_flags(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, betas, eps, weight_decay, maximize, name=None):
    """AdamW with torch's keyword arguments: a betas tuple, and a maximize flag the function branches on."""
    beta1, beta2 = betas
    if maximize:
        grads = torch._foreach_neg(grads)
    torch._foreach_add_(steps, 1)
    torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    for p, m, v, s in zip(params, exp_avgs, exp_avg_sqs, steps):
        p.add_(m / (v.sqrt() / (1 - beta2**s) ** 0.5 + eps) * (-lr / (1 - beta1**s)))


def test_keyword_tuples_are_hyperparameters_and_flags_are_static():
    """betas=(b1, b2) is two hyperparameters (new values never recompile); maximize=True/False and name=None are
    static: the function branches on them, and another value records and compiles again. Each run equals
    torch.optim.AdamW with the same options."""
    params = _lists(torch.float32, 5, 1)[0]
    state = [[torch.zeros_like(p) for p in params] for _ in range(2)] + [[torch.tensor(0.0) for _ in params]]
    reference = [torch.nn.Parameter(p.clone()) for p in params]
    steps = []  # per step: the compiled step that ran it
    for step, (maximize, betas) in enumerate([(False, (0.9, 0.99)), (False, (0.8, 0.95)), (True, (0.8, 0.95))]):
        adamw = torch.optim.AdamW(reference, lr=0.01, betas=betas, weight_decay=0.1, maximize=maximize)
        for r, m, v, s in zip(reference, *state):
            adamw.state[r] = {"step": s.clone(), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
        grads = _lists(torch.float32, 40 + step, 1)[0]
        for r, g in zip(reference, grads):
            r.grad = g.clone()
        _adamw_flags(params, grads, *state, lr=0.01, betas=betas, eps=1e-8, weight_decay=0.1, maximize=maximize)
        adamw.step()
        steps.append(_adamw_flags._cxx)
        assert _adamw_flags._cxx.compiles() == 1
        for k, (a, b) in enumerate(zip(params, reference)):
            assert_close(a, b.detach(), torch.float32, f"step {step} (maximize={maximize}) params[{k}]")
    assert steps[1] is steps[0]  # new betas: the same compiled step
    assert steps[2] is not steps[1]  # maximize flipped: recorded and compiled again
    assert_kernels(_adamw_flags, 1)

    # A list is taken as torch takes betas=[0.9, 0.99] (the function gets a list), and maximize as a bool tensor.
    before = [p.clone() for p in params]
    eager = _clone([params, *state])
    flags = dict(lr=0.01, betas=[0.9, 0.99], eps=1e-8, weight_decay=0.1, maximize=torch.tensor(True))
    _adamw_flags(params, grads, *state, **flags)
    _adamw_flags.eager(eager[0], grads, *eager[1:], **flags)
    for k, (a, b, c) in enumerate(zip(params, eager[0], before)):
        assert_close(a, b, torch.float32, f"params[{k}] with betas as a list")
        assert not torch.equal(a, c)

    hypers = dict(lr=0.01, eps=1e-8, weight_decay=0.1, maximize=False)
    with pytest.raises(optjit.Error, match=r"keyword argument betas is \(0.9, 'a'\): a step function takes numbers"):
        _adamw_flags(params, grads, *state, betas=(0.9, "a"), **hypers)
    with pytest.raises(optjit.Error, match=r"keyword argument betas is \(\): an empty sequence holds no"):
        _adamw_flags(params, grads, *state, betas=(), **hypers)
    with pytest.raises(optjit.Error, match="the hyperparameter betas_0 is given twice"):
        lion(params, grads, state[0], lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, betas=(1.0,), betas_0=1.0)

    # Two tuples whose element names do not meet are fine (x_1's elements are x_1_0 and x_1_1).
    @optjit.step_function
    def pairs(params, grads, *, x, x_1):
        torch._foreach_add_(params, grads, alpha=x[0] * x_1[1] - x[1])

    expected = [p + g * (1.0 * 4.0 - 2.0) for p, g in zip(params, grads)]
    pairs(params, grads, x=(1.0, 2.0), x_1=(3.0, 4.0))
    for k, (a, b) in enumerate(zip(params, expected)):
        assert_close(a, b, torch.float32, f"params[{k}] with x and x_1")


def test_an_op_outside_the_vocabulary_is_named():
    @optjit.step_function
    def bad(params, grads, *, lr):
        torch._foreach_erf_(params)

    with pytest.raises(optjit.Error, match="_foreach_erf_ is outside optjit's step-function vocabulary"):
        bad(*_lists(torch.float32, 3, 2), lr=0.1)

    @optjit.step_function
    def branches(params, grads, *, lr):
        if lr > 0:
            torch._foreach_add_(params, grads)

    with pytest.raises(optjit.Error, match="branches on a value computed from the hyperparameter lr"):
        branches(*_lists(torch.float32, 3, 2), lr=0.1)


@optjit.step_function
def clipped_sgd(params, grads, *, lr, max_norm):
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_add_(params, torch._foreach_mul(grads, coef), alpha=-lr)


@optjit.step_function
def peak_scaled_sgd(params, grads, *, lr):
    # The inf-norm over the lists, as clip_grad_norm_(norm_type=inf) takes it.
    peak = torch.stack(torch._foreach_norm(grads, ord=float("inf"))).max()
    torch._foreach_add_(params, torch._foreach_div(grads, peak), alpha=-lr)


@optjit.step_function
def norm_sum_scaled_sgd(params, grads, *, lr):
    # The sum of the tensors' 2-norms: each norm is a square root of a reduction, computed in the kernel after the
    # reductions' pass, so its sum over the lists ends that kernel: three kernels.
    total = torch.stack(torch._foreach_norm(grads)).sum()
    torch._foreach_add_(params, torch._foreach_div(grads, total), alpha=-lr)


def test_a_global_norm_is_two_kernels_and_equals_clip_grad_norm():
    """The total norm over every tensor of the lists (torch.stack of _foreach_norm, then a norm): the norm pass, then
    the update. Equal to torch's clip_grad_norm_ followed by the same SGD step, and to the function run by torch."""
    params, grads = _lists(torch.float32, 3, 2)
    grads = [10 * g for g in grads]  # large enough that clipping is active
    reference = [torch.nn.Parameter(p.clone()) for p in params]
    for r, g in zip(reference, grads):
        r.grad = g.clone()
    eager = _clone([params, grads])
    for step in range(3):
        clipped_sgd(params, grads, lr=0.1, max_norm=1.0)
        clipped_sgd.eager(*eager, lr=0.1, max_norm=1.0)
        total = torch.nn.utils.clip_grad_norm_(reference, 1.0)
        assert total > 1.0
        with torch.no_grad():
            for r, g in zip(reference, grads):
                r.add_(r.grad, alpha=-0.1)
                r.grad.copy_(g)  # clip_grad_norm_ scaled it in place
        for k, (a, b, c) in enumerate(zip(params, reference, eager[0])):
            assert_close(a, b.detach(), torch.float32, f"step {step} params[{k}] vs clip_grad_norm_")
            assert_close(a, c, torch.float32, f"step {step} params[{k}] vs eager")
    assert_kernels(clipped_sgd, 2)
    assert "then the host combines" in clipped_sgd.dump("fused")


def test_a_global_norm_spans_every_dtype_of_the_lists():
    """Lists of f32, f64 and bf16 tensors run as three buckets, but the norm is over every tensor, as
    clip_grad_norm_'s is: the largest grad is in the f64 tensor, so a norm per bucket would clip the others less."""
    generator = torch.Generator().manual_seed(11)
    dtypes = [torch.float32, torch.float64, torch.bfloat16, torch.float32]
    params = [torch.randn(17 + 4 * k, 3, generator=generator).to(d) for k, d in enumerate(dtypes)]
    grads = [torch.randn(p.shape, generator=generator).to(p.dtype) for p in params]
    grads[1][2, 1] = 40.0
    reference = [torch.nn.Parameter(p.clone()) for p in params]
    for r, g in zip(reference, grads):
        r.grad = g.clone()
    eager = _clone([params, grads])
    clipped_sgd(params, grads, lr=1.0, max_norm=1.0)
    clipped_sgd.eager(*eager, lr=1.0, max_norm=1.0)
    assert torch.nn.utils.clip_grad_norm_(reference, 1.0) > 1.0
    with torch.no_grad():
        for r in reference:
            r.add_(r.grad, alpha=-1.0)
    # torch takes the bf16 tensor's norm in bf16 (optjit accumulates every norm in f64), so the coefficient, and
    # with it every tensor, agrees to bf16's precision (one bf16 ulp is 2^-8 relative).
    for k, (a, b, c) in enumerate(zip(params, reference, eager[0])):
        for other, what in ((b.detach(), "clip_grad_norm_"), (c, "eager")):
            torch.testing.assert_close(a, other, rtol=1e-2, atol=1e-2, msg=lambda m: f"params[{k}] vs {what}: {m}")
    assert_kernels(clipped_sgd, 6)  # two per (dtype) bucket


@pytest.mark.parametrize("fn,kernels", [(peak_scaled_sgd, 2), (norm_sum_scaled_sgd, 3)], ids=["max", "sum"])
def test_the_inf_norm_and_sum_over_the_lists_follow_torch(fn, kernels):
    ours = _lists(torch.float64, 4, 2)
    _compiled_and_eager(fn, ours, _clone(ours), fn.__name__, dtype=torch.float64, lr=0.5)
    assert_kernels(fn, kernels)


def test_calls_on_stacks_outside_the_vocabulary_are_errors():
    @optjit.step_function
    def bad(params, grads, *, lr):
        norms = torch.stack(torch._foreach_norm(grads))
        torch._foreach_mul_(params, torch.linalg.vector_norm(norms, ord=1))

    params, grads = _lists(torch.float32, 5, 2)
    with pytest.raises(optjit.Error, match="a norm of order 1: optjit records the 2-norm and the inf-norm"):
        bad(params, grads, lr=0.1)

    @optjit.step_function
    def mixed(params, grads, *, lr):
        torch.stack([torch._foreach_norm(grads)[0], lr])

    with pytest.raises(optjit.Error, match="torch.stack: optjit stacks one per-tensor scalar of each tensor"):
        mixed(params, grads, lr=0.1)


def test_clamp_bounds_take_torchs_keywords_and_odd_dims_and_products_are_errors_naming_them():
    """torch._foreach_clamp_min's keyword is scalar=; a dim outside -1 and -2 (any integer, however large) and a product
    of stacks are optjit.Errors naming what was written, never another exception."""

    @optjit.step_function
    def floored(params, grads, *, lr):
        torch._foreach_add_(params, torch._foreach_clamp_max(torch._foreach_clamp_min(grads, scalar=-0.5), scalar=0.5),
                            alpha=-lr)

    ours = _lists(torch.float64, 4, 2)
    _compiled_and_eager(floored, ours, _clone(ours), "clamped", dtype=torch.float64, lr=0.5)

    def refused(body, message):
        step = optjit.step_function(body)
        with pytest.raises(optjit.Error, match=message):
            step(*_lists(torch.float32, 2, 2), lr=0.1)

    def huge_dim(params, grads, *, lr):
        for p, g in zip(params, grads):
            p.add_(g.sum(dim=2**40, keepdim=True), alpha=-lr)

    def huge_size(params, grads, *, lr):
        for p, g in zip(params, grads):
            p.add_(g, alpha=-lr / g.size(-(2**40)))

    def stack_product(params, grads, *, lr):
        norms = torch.stack(torch._foreach_norm(grads))
        torch._foreach_mul_(params, torch.matmul(norms, norms))

    refused(huge_dim, r"sum along dim=1099511627776: optjit records the sum, mean and 2-norm along dim -1 or -2")
    refused(huge_size, r"size\(-1099511627776\): optjit records size\(-1\), size\(-2\) and numel\(\)")
    refused(stack_product, "the operator @ on elements: optjit records the product of two element values")


@optjit.step_function
def adam_with_steps(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps):
    # torch's _multi_tensor_adam with its per-tensor step counts: incremented in place, then a bias correction per
    # tensor written per element of the list, as a foreach_map user writes it.
    torch._foreach_add_(steps, 1)
    bias_correction1 = [1 - beta1**s for s in steps]
    bias_correction2 = [(1 - beta2**s) ** 0.5 for s in steps]
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    denom = torch._foreach_div(torch._foreach_sqrt(exp_avg_sqs), bias_correction2)
    torch._foreach_add_(denom, eps)
    updates = torch._foreach_div(exp_avgs, denom)
    torch._foreach_mul_(updates, [-lr / bc for bc in bias_correction1])
    torch._foreach_add_(params, updates)


def test_per_tensor_step_counts_are_updated_and_read_as_torch_does():
    params, grads, exp_avgs, exp_avg_sqs = _lists(torch.float32, 8, 4)
    exp_avgs, exp_avg_sqs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    steps = [torch.tensor(0.0) for _ in params]
    eager = _clone([params, grads, exp_avgs, exp_avg_sqs, steps])
    reference = [torch.nn.Parameter(p.clone()) for p in params]
    adam = torch.optim.Adam(reference, lr=0.01, betas=(0.8, 0.95), eps=1e-8, foreach=True)
    hypers = dict(lr=0.01, beta1=0.8, beta2=0.95, eps=1e-8)
    for _ in range(3):
        for r, g in zip(reference, grads):
            r.grad = g.clone()
        adam_with_steps(params, grads, exp_avgs, exp_avg_sqs, steps, **hypers)
        adam_with_steps.eager(*eager, **hypers)
        adam.step()
    assert [float(s) for s in steps] == [3.0] * len(params)
    assert_kernels(adam_with_steps, 1)
    for k, (a, b, c) in enumerate(zip(params, eager[0], reference)):
        assert_close(a, b, torch.float32, f"params[{k}] vs eager")
        assert_close(a, c.detach(), torch.float32, f"params[{k}] vs torch.optim.Adam")


def test_what_a_step_function_cannot_record_is_an_error_naming_it():
    """Parts of lists, comparisons that would fix a branch, tensor methods and operators outside the vocabulary, a
    branch on a tensor's shape, entries stepped differently, and a function that writes nothing: each an
    optjit.Error, never a program that differs from the function."""

    @optjit.step_function
    def first_only(params, grads, *, lr):
        torch._foreach_add_(params[:1], grads[:1], alpha=-lr)

    @optjit.step_function
    def by_flag(params, grads, *, lr, maximize):
        if maximize == 1:
            grads = torch._foreach_neg(grads)
        torch._foreach_add_(params, grads, alpha=-lr)

    @optjit.step_function
    def by_method(params, grads, *, lr):
        for p, g in zip(params, grads):
            p.erfinv_()

    @optjit.step_function
    def by_operator(params, grads, *, lr):
        torch._foreach_add_(params, [g @ g for g in grads], alpha=-lr)

    @optjit.step_function
    def by_shape(params, grads, *, lr):
        for p, g in zip(params, grads):
            if p.dim() > 1:
                p.add_(g, alpha=-lr)

    @optjit.step_function
    def by_position(params, grads, *, lr):
        for k, (p, g) in enumerate(zip(params, grads)):
            p.add_(g, alpha=-lr if k == 0 else lr)

    @optjit.step_function
    def writes_nothing(params, grads, *, lr):
        torch._foreach_mul(grads, lr)

    cases = [
        (first_only, {}, "records whole lists, and this one has 1 of the 2 tensors"),
        (by_flag, {"maximize": 1}, "branches on a value computed from the hyperparameter maximize"),
        (by_method, {}, r"\.erfinv_ of an element of a tensor list is outside"),
        (by_operator, {}, r"the operator @ on elements of a list with a param of rank 1: optjit multiplies the matrices"),
        (by_shape, {}, r"\.dim of an element of a tensor list is outside"),
        (by_position, {}, "updates part of list 'param'"),
        (writes_nothing, {}, "changes none of its lists"),
    ]
    for fn, extra, message in cases:
        params, grads = _lists(torch.float32, 5, 2, shapes=((3,), (2,)))
        before = [p.clone() for p in params]
        with pytest.raises(optjit.Error, match=message):
            fn(params, grads, lr=0.5, **extra)
        assert all(torch.equal(a, b) for a, b in zip(params, before)), fn.__name__


def test_new_grads_every_call_repoint_the_compiled_step_and_aliased_lists_are_refused():
    """After each backward the grads are new tensors: the compiled step is kept and its grads repointed (not built
    again), and every call still equals the function run by torch. A tensor in two lists is refused."""
    params, exp_avgs = _lists(torch.float32, 9, 2)
    exp_avgs = [torch.zeros_like(p) for p in params]
    eager = _clone([params, exp_avgs])
    hypers = dict(lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.1)
    compiled = None
    for step in range(3):
        grads = _lists(torch.float32, 20 + step, 1)[0]
        lion(params, grads, exp_avgs, **hypers)
        lion.eager(eager[0], [g.clone() for g in grads], eager[1], **hypers)
        compiled = compiled or lion._cxx
        assert lion._cxx is compiled, "new grads built the compiled step again"
        for k, (a, b) in enumerate(zip(params, eager[0])):
            assert_close(a, b, torch.float32, f"step {step} params[{k}]")
    with pytest.raises(optjit.Error, match="tensor 0 of list 'param' and tensor 0 of list 'exp_avgs' share memory"):
        lion(params, grads, params, **hypers)
    # New grads that are the state (after a call with good ones) are refused before anything changes.
    before = [t.clone() for t in params + exp_avgs]
    with pytest.raises(optjit.Error, match="list 'grad' and tensor 0 of list 'exp_avgs' share memory"):
        lion(params, exp_avgs, exp_avgs, **hypers)
    assert all(torch.equal(a, b) for a, b in zip(params + exp_avgs, before))


def test_a_step_function_that_returns_a_value_is_refused():
    @optjit.step_function
    def clipped_and_logged(params, grads, *, lr):
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        torch._foreach_add_(params, grads, alpha=-lr)
        return total

    params, grads = _lists(torch.float32, 3, 2)
    with pytest.raises(optjit.Error, match="returns a value: a compiled step's results are its lists"):
        clipped_and_logged(params, grads, lr=0.1)


def test_a_norm_changed_in_place_is_the_changed_norm_over_the_lists():
    @optjit.step_function
    def doubled_norm_clip(params, grads, *, lr):
        norms = torch._foreach_norm(grads)
        torch._foreach_mul_(norms, 2.0)  # the 2-norm over the lists is now of the doubled norms
        total = torch.linalg.vector_norm(torch.stack(norms))
        torch._foreach_add_(params, torch._foreach_mul(grads, 1.0 / total), alpha=-lr)

    ours = _lists(torch.float32, 11, 2)
    reference = _clone(ours)
    doubled_norm_clip(*ours, lr=0.1)
    doubled_norm_clip.eager(*reference, lr=0.1)
    for a, b in zip(ours[0], reference[0]):
        assert_close(a, b, torch.float32, "params")


def test_lists_out_of_order_and_one_tensors_value_for_all_are_refused():
    @optjit.step_function
    def reversed_grads(params, grads, *, lr):
        torch._foreach_add_(params, list(reversed(grads)), alpha=-lr)

    with pytest.raises(optjit.Error, match=r"reordered or repeats a tensor \(its elements are tensors \[2, 1, 0\]"):
        reversed_grads(*_lists(torch.float32, 3, 2), lr=0.1)

    @optjit.step_function
    def first_norm(params, grads, *, lr):
        norm = torch._foreach_norm(grads)[0]
        torch._foreach_div_(params, norm)

    with pytest.raises(optjit.Error, match="one tensor's value \\(element 0 of a list"):
        first_norm(*_lists(torch.float32, 3, 2), lr=0.1)

    @optjit.step_function
    def python_sum(params, grads, *, lr):
        total = sum(torch._foreach_norm(grads))
        torch._foreach_div_(params, total)

    with pytest.raises(optjit.Error, match="combines the values of different tensors of a list"):
        python_sum(*_lists(torch.float32, 3, 2), lr=0.1)


def test_a_state_list_named_grad_is_a_list_of_its_own():
    @optjit.step_function
    def momentum(w, dw, grad, *, lr):  # the third list's parameter is named like the grads' slot
        torch._foreach_mul_(grad, 0.5)
        torch._foreach_add_(grad, dw)
        torch._foreach_add_(w, grad, alpha=-lr)

    ours = _lists(torch.float32, 5, 3)
    reference = _clone(ours)
    momentum(*ours, lr=0.1)
    momentum.eager(*reference, lr=0.1)
    for lst, ref in zip(ours, reference):
        for a, b in zip(lst, ref):
            assert_close(a, b, torch.float32, "lists")


def test_overlapping_views_are_refused_and_a_failed_call_leaves_the_function_usable():
    @optjit.step_function
    def sgd(params, grads, bufs, *, lr):
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-lr)

    buffer = torch.zeros(20)
    with pytest.raises(optjit.Error, match="tensor 0 of list 'param' and tensor 0 of list 'bufs' share memory"):
        sgd([buffer[:10]], [torch.ones(10)], [buffer[5:15]], lr=0.1)
    # Views interleaved in one buffer (every other element each) share no element: they step, as torch's ops do.
    interleaved = torch.zeros(20)
    sgd([interleaved[::2]], [torch.ones(10)], [interleaved[1::2]], lr=0.1)
    assert_close(interleaved[::2], torch.full((10,), -0.1), torch.float32, "interleaved param")
    assert_close(interleaved[1::2], torch.ones(10), torch.float32, "interleaved buf")
    params, grads, bufs = [torch.zeros(10)], [torch.ones(10)], [torch.zeros(10)]
    sgd(params, grads, bufs, lr=0.1)  # the failed first call left nothing behind
    assert_close(params[0], torch.full((10,), -0.1), torch.float32, "param")


def test_a_list_that_stops_being_scalar_state_is_recorded_again():
    @optjit.step_function
    def scaled(params, grads, steps, *, lr):
        torch._foreach_add_(steps, 1)
        torch._foreach_add_(params, torch._foreach_mul(grads, [lr / s for s in steps]))

    scaled([torch.zeros(())], [torch.ones(())], [torch.zeros(())], lr=1.0)  # all 0-d: steps is a tensor list
    params, steps = [torch.zeros(3)], [torch.zeros(())]
    scaled(params, [torch.ones(3)], steps, lr=1.0)  # beside [3] params: per-tensor scalar state
    assert_close(params[0], torch.ones(3), torch.float32, "param")
    assert steps[0].item() == 1.0


def test_pow_by_a_number_is_torchs_sqrt_and_products():
    @optjit.step_function
    def roots(params, grads):
        torch._foreach_pow_(params, 0.5)
        torch._foreach_pow_(grads, -2)

    params = [torch.tensor([float("-inf"), -0.0, 4.0])]
    grads = [torch.tensor([0.0, -0.5, 3.0])]
    reference = [[t.clone() for t in params], [t.clone() for t in grads]]
    roots(params, grads)
    roots.eager(*reference)
    torch.testing.assert_close(params[0], reference[0][0], equal_nan=True)
    assert params[0][1].signbit() and reference[0][0][1].signbit()  # sqrt(-0.0) is -0.0
    torch.testing.assert_close(grads[0], reference[1][0])


def test_names_that_are_not_identifiers_and_scalar_operators():
    def body(params, grads, *, lr):
        torch._foreach_add_(params, grads, alpha=-lr)

    step = optjit.step_function(lambda params, grads, *, lr: body(params, grads, lr=lr))
    params = [torch.zeros(3)]
    step(params, [torch.ones(3)], lr=0.5)
    assert_close(params[0], torch.full((3,), -0.5), torch.float32, "param")

    @optjit.step_function
    def floors(params, grads, *, lr):
        torch._foreach_add_(params, grads, alpha=lr // 2)

    with pytest.raises(optjit.Error, match="// on a hyperparameter or per-tensor scalar is outside"):
        floors([torch.zeros(3)], [torch.ones(3)], lr=1.0)


def test_alpha_from_one_tensor_is_refused_and_a_new_list_length_is_recorded_again():
    @optjit.step_function
    def first_step_alpha(params, grads, steps, *, lr):
        torch._foreach_add_(params, grads, alpha=steps[0] * -lr)

    with pytest.raises(optjit.Error, match="add alpha: one tensor's value"):
        first_step_alpha(
            [torch.zeros(3), torch.zeros(2)], [torch.ones(3), torch.ones(2)], [torch.ones(()), torch.ones(())], lr=0.1
        )

    @optjit.step_function
    def averaged(params, grads, *, lr):
        torch._foreach_add_(params, grads, alpha=-lr / len(params))  # Python reads the length while recording

    for count in (3, 2):
        params = [torch.zeros(4) for _ in range(count)]
        averaged(params, [torch.ones(4) for _ in range(count)], lr=1.0)
        assert_close(params[0], torch.full((4,), -1.0 / count), torch.float32, f"{count} tensors")


def _shampoo_basic(params, grads, preconditioners, *, lr, weight_decay, beta1, beta2, epsilon):
    """The seed's shampoo_functional_basic at its step 1 (no root inverse, no grafting), with its lists passed in:
    weight decay into the grads, the preconditioners' accumulation, momentum on the grads in place, bias
    corrections, the preconditioned direction, decay again, and the update."""
    torch._foreach_add_(grads, params, alpha=weight_decay)
    torch._foreach_addcmul_(preconditioners, grads, grads, value=1.0)
    torch._foreach_mul_(grads, beta1)
    torch._foreach_add_(grads, grads, alpha=1 - beta1)
    grad_list = torch._foreach_div(grads, 1.0 - beta1)
    corrected = torch._foreach_div(preconditioners, 1.0 - beta2)
    torch._foreach_sqrt_(corrected)
    torch._foreach_add_(corrected, epsilon)
    directions = torch._foreach_div(grad_list, corrected)
    torch._foreach_add_(directions, params, alpha=weight_decay)
    torch._foreach_mul_(directions, -lr)
    torch._foreach_add_(params, directions)


@pytest.mark.parametrize("beta2", [1.0, 0.99], ids=["the seed's beta2 (its bias correction is 0)", "beta2 0.99"])
def test_the_seeds_shampoo_functional_basic_on_its_transposed_params(beta2):
    """The seed's function on the seed's params, .t() of the two [512, 128] halves of one [1024, 128] buffer, compiled
    and eager: params, preconditioners and the grads it writes in place agree."""
    compiled = optjit.step_function(_shampoo_basic)

    def lists(seed):
        generator = torch.Generator().manual_seed(seed)
        buffer = torch.rand((1024, 128), generator=generator)
        params = [buffer[0:512, :].t(), buffer[512:, :].t()]
        grads = [torch.rand(p.shape, generator=generator) for p in params]
        return buffer, params, grads, [torch.zeros_like(p) for p in params]

    buffer, params, grads, preconditioners = lists(3)
    _, ref_params, ref_grads, ref_preconditioners = lists(3)
    hypers = dict(lr=0.01, weight_decay=0.1, beta1=0.9, beta2=beta2, epsilon=1e-10)
    compiled(params, grads, preconditioners, **hypers)
    _shampoo_basic(ref_params, ref_grads, ref_preconditioners, **hypers)
    compared = (
        ("param", params, ref_params),
        ("grad", grads, ref_grads),
        ("preconditioner", preconditioners, ref_preconditioners),
    )
    for name, ours, theirs in compared:
        for a, b in zip(ours, theirs):
            assert_close(a, b, torch.float32, name)
    assert params[0].data_ptr() == buffer.data_ptr()  # in place, in the buffer
    assert_kernels(compiled, 1)


def test_a_step_function_keeps_no_grad_alive():
    """The grads are the caller's: once it drops them (zero_grad() before the next backward), they are freed, and
    the next call's grads, at the same addresses or not, are read."""

    @optjit.step_function
    def sgd(params, grads, *, lr):
        torch._foreach_add_(params, grads, alpha=-lr)

    params = [torch.zeros(5), torch.zeros(3, 2).t()]
    for t in range(4):
        grads = [torch.full((5,), 1.0 + t), torch.full((2, 3), 1.0 + t) if t % 2 else torch.full((3, 2), 1.0 + t).t()]
        read = [weakref.ref(g) for g in grads]
        sgd(params, grads, lr=0.5)
        del grads
        assert all(grad() is None for grad in read), "a grad outlived its call"
    for p in params:  # -0.5 * (1 + 2 + 3 + 4)
        assert_close(p, torch.full(p.shape, -5.0), torch.float32, "param")


def _update_exp_avg_sq(exp_avg_sq, grad, beta2):
    return exp_avg_sq.mul(beta2).addcmul(grad, grad, value=1 - beta2)


def _update_param(param, step, exp_avg, exp_avg_sq, beta1, beta2, lr, eps):
    bias_correction1 = 1 - torch.pow(beta1, step)
    bias_correction2 = (1 - torch.pow(beta2, step)).sqrt()
    step_size = (lr / bias_correction1).neg()
    denom = (exp_avg_sq.sqrt() / (bias_correction2 * step_size)).add(eps / step_size)
    return torch.add(param, torch.div(exp_avg, denom))


@optjit.step_function
def foreach_map_adam(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps):
    """Adam as torch's foreach_map recipe writes it: per-tensor functions mapped over the lists with
    torch._higher_order_ops.foreach_map, the results copied back with torch._foreach_copy_."""
    from torch._higher_order_ops import foreach_map

    torch._foreach_copy_(steps, foreach_map(lambda x: x + 1, steps))
    exp_avgs_updated = foreach_map(torch.lerp, exp_avgs, grads, 1 - beta1)
    exp_avg_sqs_updated = foreach_map(_update_exp_avg_sq, exp_avg_sqs, grads, beta2)
    params_updated = foreach_map(
        _update_param, params, steps, exp_avgs_updated, exp_avg_sqs_updated, beta1, beta2, lr, eps
    )
    torch._foreach_copy_(exp_avgs, exp_avgs_updated)
    torch._foreach_copy_(exp_avg_sqs, exp_avg_sqs_updated)
    torch._foreach_copy_(params, params_updated)


def test_torchs_foreach_map_adam_is_one_kernel_and_matches_torch_optim_adam():
    params, grads = _lists(torch.float32, 11, 2)
    state = [[torch.zeros_like(p) for p in params] for _ in range(2)] + [[torch.tensor(0.0) for _ in params]]
    eager = _clone([params, grads, *state])
    reference = [torch.nn.Parameter(p.clone()) for p in params]
    adam = torch.optim.Adam(reference, lr=0.01, betas=(0.8, 0.95), eps=1e-8, foreach=True)
    hypers = dict(lr=0.01, beta1=0.8, beta2=0.95, eps=1e-8)
    for step in range(4):
        grads = _lists(torch.float32, 30 + step, 1)[0]
        for r, g in zip(reference, grads):
            r.grad = g.clone()
        foreach_map_adam(params, grads, *state, **hypers)
        foreach_map_adam.eager(eager[0], [g.clone() for g in grads], *eager[2:], **hypers)
        adam.step()
        for k, (a, b, c) in enumerate(zip(params, eager[0], reference)):
            assert_close(a, b, torch.float32, f"step {step} params[{k}] vs the function run by torch")
            assert_close(a, c.detach(), torch.float32, f"step {step} params[{k}] vs torch.optim.Adam")
    assert [float(s) for s in state[2]] == [4.0] * len(params)
    assert_kernels(foreach_map_adam, 1)
    assert foreach_map_adam._cxx.compiles() == 1


@optjit.step_function
def looped_lion(params, grads, exp_avgs, *, lr, beta1, beta2, weight_decay):
    """Lion one tensor at a time, as a torch.optim single-tensor step is written: tensor methods, in place."""
    for p, g, m in zip(params, grads, exp_avgs):
        p.mul_(1 - lr * weight_decay).add_(torch.sign(torch.lerp(m, g, 1 - beta1)), alpha=-lr)
        m.lerp_(g, 1 - beta2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_a_loop_over_the_tensors_records_what_the_foreach_form_records(dtype):
    ours, theirs = _lists(dtype, 12, 3), _lists(dtype, 12, 3)
    hypers = dict(lr=1e-2, beta1=0.9, beta2=0.99, weight_decay=0.1)
    for _ in range(3):
        looped_lion(*ours, **hypers)
        lion(*theirs, **hypers)
    for lst, ref in zip(ours, theirs):
        for a, b in zip(lst, ref):
            assert torch.equal(a, b)  # the same ops in another order: the same bits
    assert_kernels(looped_lion, 1)


@optjit.step_function
def lars_like(params, grads, bufs, *, lr, momentum, trust_coefficient, eps):
    """Per-tensor norms of elements (x.norm()), a trust ratio chosen with torch.where on comparisons, and
    torch._foreach_max / _foreach_rsqrt / _foreach_zero_ / _foreach_pow(number, list) beside them."""
    for p, g, b in zip(params, grads, bufs):
        w_norm, g_norm = p.norm(), torch.linalg.vector_norm(g)
        ratio = torch.where((w_norm > 0) * (g_norm > 0), trust_coefficient * w_norm / (g_norm + eps), 1.0)
        b.mul_(momentum).add_(g * ratio)
    peaks = torch._foreach_max(torch._foreach_abs(grads))
    scales = torch._foreach_rsqrt(torch._foreach_add(torch._foreach_pow(2.0, peaks), 1.0))
    torch._foreach_add_(params, torch._foreach_mul(bufs, scales), alpha=-lr)
    torch._foreach_zero_(grads)


def test_element_norms_where_and_the_further_foreach_ops_follow_torch():
    ours = _lists(torch.float64, 13, 3, shapes=((33, 7), (5,), (4, 4, 3), ()))
    ours[0][1].zero_()  # a zero param: trust ratio 1
    ours[2] = [torch.zeros_like(p) for p in ours[0]]
    theirs = _clone(ours)
    hypers = dict(lr=0.1, momentum=0.9, trust_coefficient=0.001, eps=1e-8)
    for step in range(3):
        grads = _lists(torch.float64, 40 + step, 1, shapes=((33, 7), (5,), (4, 4, 3), ()))[0]
        eager_grads = [g.clone() for g in grads]
        lars_like(ours[0], grads, ours[2], **hypers)
        lars_like.eager(theirs[0], eager_grads, theirs[2], **hypers)
        for what, k in (("params", 0), ("bufs", 2)):
            for i, (a, b) in enumerate(zip(ours[k], theirs[k])):
                assert_close(a, b, torch.float64, f"step {step} {what}[{i}]")
        assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)  # _foreach_zero_ wrote the grads
    assert_kernels(lars_like, 2)  # the norms and maxima, then the update


def test_element_ops_that_mix_tensors_or_read_a_list_are_refused():
    @optjit.step_function
    def crossed(params, grads, *, lr):
        for p, g in zip(params, reversed(grads)):
            p.add_(g, alpha=-lr)

    with pytest.raises(optjit.Error, match="combines the values of different tensors of a list"):
        crossed(*_lists(torch.float32, 3, 2), lr=0.1)

    @optjit.step_function
    def list_operand(params, grads, *, lr):
        for p in params:
            p.mul_(grads)

    with pytest.raises(optjit.Error, match="mul on an element takes elements, scalars and numbers, not a list"):
        list_operand(*_lists(torch.float32, 3, 2), lr=0.1)

    @optjit.step_function
    def by_dim(params, grads, *, lr):
        for p, g in zip(params, grads):
            p.add_(g.sum(dim=0), alpha=-lr)

    with pytest.raises(optjit.Error, match="sum along dim=0: optjit records the sum, mean and 2-norm"):
        by_dim(*_lists(torch.float32, 3, 2), lr=0.1)


def _edge_lists():
    p = torch.tensor([[1.0, -1.0, 0.0], [2.0, -0.5, 3.0]])
    g = torch.tensor([[1.0, 1.0, -1.0], [-2.0, 0.25, 0.0]])
    return [[p, p[0].clone()], [g, g[1].clone()]]


@pytest.mark.parametrize(
    "body",
    [
        lambda p, g, lr: p.copy_(((p > 0) + (g > 0)) * lr),  # bool + bool is an or
        lambda p, g, lr: p.copy_(((p > 0) * (g >= 0)) * lr + torch.where(p != g, g, -p)),
        lambda p, g, lr: p.mul_(-0.0).add_(g.mul(0.0)),  # -0.0 and 0.0 are two constants
        lambda p, g, lr: (g.fill_(2.0), p.add_(g.sum() * lr), p.sub_(g.norm())),  # a filled tensor's reductions
        lambda p, g, lr: p.copy_(g.norm()).mul_(torch.max(p, g)),  # a per-tensor value written to a tensor
        lambda p, g, lr: (lambda x: (x.add_(g), p.mul_(lr)))(p),  # x = p; x += g writes p
    ],
    ids=["bool_or", "bool_and_where", "signed_zeros", "fill_then_reduce", "copy_a_norm", "alias"],
)
def test_element_steps_keep_torchs_semantics_at_the_edges(body):
    @optjit.step_function
    def fn(params, grads, *, lr):
        for p, g in zip(params, grads):
            body(p, g, lr)

    ours, theirs = _edge_lists(), _edge_lists()
    fn(*ours, lr=0.1)
    fn.eager(*theirs, lr=0.1)
    for lst, ref in zip(ours, theirs):
        for a, b in zip(lst, ref):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
            assert torch.equal(torch.signbit(a), torch.signbit(b)), (a, b)


def test_element_steps_that_torch_refuses_or_that_mix_entries_are_errors():
    def refused(body, message):
        @optjit.step_function
        def fn(params, grads, *, lr):
            body(params, grads, lr)

        with pytest.raises(optjit.Error, match=message):
            fn(*_edge_lists(), lr=0.1)

    def each(f):
        return lambda params, grads, lr: [f(p, g, lr) for p, g in zip(params, grads)]

    refused(each(lambda p, g, lr: p.copy_(-(p > 0))), "torch does not negate bool tensors")
    refused(each(lambda p, g, lr: p.copy_((p > 0) - (g > 0))), "torch does not subtract bool tensors")
    refused(each(lambda p, g, lr: p.copy_(torch.where(g, p, 0.0))), "torch.where's condition is not a comparison")
    refused(each(lambda p, g, lr: p.maximum_(g)), r"\.maximum_ of an element of a tensor list is outside")
    refused(each(lambda p, g, lr: p.copy_(~(p > 0))), r"the operator ~, &, \| or \^ on an element")

    def total_times_first(params, grads, lr):  # a value of every entry, written with one entry's
        total = torch.stack(torch._foreach_norm(grads)).sum()
        total.mul_(params[0].norm())
        for p in params:
            p.add_(total * lr)

    refused(total_times_first, "combines the values of different tensors of a list")

    def rebinds(params, grads, lr):  # putting another value in a list's entry writes no tensor, as in torch
        for k in range(len(params)):
            params[k] = params[k] - lr * grads[k]

    refused(rebinds, "changes none of its lists")


def test_a_scalars_sum_is_a_new_value_that_writing_leaves_the_scalar_alone():
    @optjit.step_function
    def fn(params, grads, steps, *, lr):
        for p, s in zip(params, steps):
            t = s.sum()
            t += 1
            p.add_(t * lr)

    params, grads = _lists(torch.float32, 4, 2)
    steps = [torch.tensor(1.0) for _ in params]
    eager = _clone([params, grads, steps])
    fn(params, grads, steps, lr=0.1)
    fn.eager(*eager, lr=0.1)
    assert [float(s) for s in steps] == [1.0] * len(params)
    for a, b in zip(params, eager[0]):
        assert_close(a, b, torch.float32, "params")


@optjit.step_function
def factored_adafactor(params, grads, steps, row_vars, col_vars, *, lr, beta2_decay, eps1, eps2, d):
    """torch.optim.Adafactor's single-tensor step for params of rank >= 2, one tensor at a time as torch writes it
    (Python's min and max of its .item() numbers as clamps): row and column state, their norms and means along dim -1
    and -2, the outer product row_var @ col_var."""
    for p, g, s, row_var, col_var in zip(params, grads, steps, row_vars, col_vars):
        s += 1
        one_minus_beta2_t = s**beta2_decay
        rho_t = torch.clamp(1 / s**0.5, max=lr)
        alpha = torch.clamp(p.norm(2) / p.numel() ** 0.5, min=eps2) * rho_t
        row_mean = torch.norm(g, dim=-1, keepdim=True).square_().div_(g.size(-1))
        row_var.lerp_(row_mean, one_minus_beta2_t)
        col_mean = torch.norm(g, dim=-2, keepdim=True).square_().div_(g.size(-2))
        col_var.lerp_(col_mean, one_minus_beta2_t)
        var_estimate = row_var @ col_var
        var_estimate.div_(row_var.mean(dim=-2, keepdim=True).clamp_(min=eps1))
        update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()
        update.mul_(g)
        denom = torch.clamp(update.norm(2) / (update.numel() ** 0.5 * d), min=1.0)
        p.add_(update, alpha=-alpha / denom)


def test_adafactor_written_with_row_and_column_state_matches_torch_optim_adafactor():
    shapes = ((33, 7), (4, 5, 6), (20, 64))
    params = _lists(torch.float32, 14, 1, shapes=shapes)[0]
    reference = [torch.nn.Parameter(p.clone()) for p in params]
    opt = torch.optim.Adafactor(reference, lr=0.01, foreach=False)
    steps = [torch.tensor(0.0) for _ in params]
    row_vars = [torch.zeros(p.shape[:-1] + (1,)) for p in params]
    col_vars = [torch.zeros(p.shape[:-2] + (1, p.shape[-1])) for p in params]
    eager = _clone([params, params, steps, row_vars, col_vars])
    hypers = dict(lr=0.01, beta2_decay=-0.8, eps1=torch.finfo(torch.float32).eps, eps2=1e-3, d=1.0)
    for step in range(3):
        grads = _lists(torch.float32, 50 + step, 1, shapes=shapes)[0]
        for r, g in zip(reference, grads):
            r.grad = g.clone()
        opt.step()
        factored_adafactor(params, grads, steps, row_vars, col_vars, **hypers)
        factored_adafactor.eager(eager[0], [g.clone() for g in grads], *eager[2:], **hypers)
        for k, (a, b, c) in enumerate(zip(params, eager[0], reference)):
            assert_close(a, b, torch.float32, f"step {step} params[{k}] vs the function run by torch")
            assert_close(a, c.detach(), torch.float32, f"step {step} params[{k}] vs torch.optim.Adafactor")
        for k, (r, c) in enumerate(zip(row_vars, reference)):
            assert_close(r, opt.state[c]["row_var"], torch.float32, f"step {step} row_var[{k}]")
            assert_close(col_vars[k], opt.state[c]["col_var"], torch.float32, f"step {step} col_var[{k}]")
    assert_kernels(factored_adafactor, 4)  # as torch.optim.Adafactor's factored params compile
    assert factored_adafactor._cxx.compiles() == 1


def test_rows_and_columns_that_torch_would_not_broadcast_are_refused():
    shapes = ((6, 5), (3, 4))

    def lists():
        params = _lists(torch.float32, 15, 2, shapes=shapes)
        return params + [[torch.zeros(s[0], 1) for s in shapes]]

    def refused(body, message):
        @optjit.step_function
        def fn(params, grads, row_vars, *, lr):
            for p, g, r in zip(params, grads, row_vars):
                body(p, g, r, lr)

        with pytest.raises(optjit.Error, match=message):
            fn(*lists(), lr=0.1)

    refused(lambda p, g, r, lr: r.add_(g), "writes a value of one per element into a tensor of one per row")
    refused(lambda p, g, r, lr: p.add_(r.sum() * lr), "sum over a whole tensor of one value per row")
    refused(lambda p, g, r, lr: p.add_(g.sum(dim=-1) * lr), "without keepdim=True")
    refused(lambda p, g, r, lr: p.add_(g @ r), "the operator @ on elements")
    refused(lambda p, g, r, lr: p.add_(g.size(0)), r"size\(0\): optjit records size\(-1\), size\(-2\) and numel\(\)")


def test_row_and_column_sums_of_transposed_params_follow_their_logical_shape():
    """A .t() view's rows are its logical rows, not its memory's: it steps through contiguous copies."""

    @optjit.step_function
    def normalized(params, grads, *, lr):
        for p, g in zip(params, grads):
            p.sub_(g / g.norm(dim=-1, keepdim=True) * lr + g.mean(dim=-2, keepdim=True))

    def lists():
        generator = torch.Generator().manual_seed(16)
        params = [torch.randn(7, 5, generator=generator).t(), torch.randn(4, 6, generator=generator)]
        grads = [torch.randn(7, 5, generator=generator).t(), torch.randn(6, 4, generator=generator).t()]
        return [params, grads]

    ours, theirs = lists(), lists()
    normalized(*ours, lr=0.1)
    normalized.eager(*theirs, lr=0.1)
    for a, b in zip(ours[0], theirs[0]):
        assert_close(a, b, torch.float32, "params")
    assert not ours[0][0].is_contiguous()  # stepped in place, in its own layout


def test_a_narrower_value_written_into_a_tensor_keeps_the_tensors_shape():
    """A row's values copied into a matrix, or a matrix's into rows state, broadcast as torch's copy_ does: later sums
    along its dimensions, its numel and sizes are the tensor's."""

    @optjit.step_function
    def copied(params, grads, row_vars, bufs, *, lr):
        for p, g, r, b in zip(params, grads, row_vars, bufs):
            b.copy_(r)
            r.copy_(g.sum(dim=-1, keepdim=True).sum(dim=-2, keepdim=True))
            p.add_(b.sum(dim=-1, keepdim=True) * lr + b.numel() + b.size(-1) + r.sum(dim=-2, keepdim=True) * lr)

    @optjit.step_function
    def copied_by_foreach(params, grads, row_vars, bufs, *, lr):
        torch._foreach_copy_(bufs, row_vars)
        for p, b in zip(params, bufs):
            p.add_(b.mean(dim=-1, keepdim=True) * lr + b.norm())

    def lists():
        generator = torch.Generator().manual_seed(17)
        shapes = ((4, 5), (2, 3, 6))
        params = [torch.randn(s, generator=generator) for s in shapes]
        grads = [torch.randn(s, generator=generator) for s in shapes]
        rows = [torch.randn(s[:-1] + (1,), generator=generator) for s in shapes]
        return [params, grads, rows, [torch.zeros(s) for s in shapes]]

    for fn in (copied, copied_by_foreach):
        ours, theirs = lists(), lists()
        fn(*ours, lr=0.1)
        fn.eager(*theirs, lr=0.1)
        for lst, ref in zip(ours, theirs):
            for a, b in zip(lst, ref):
                assert_close(a, b, torch.float32, fn.__name__)


def test_writes_and_sizes_torch_refuses_are_refused():
    def refused(body, message, shapes=((4, 5), (3, 6))):
        @optjit.step_function
        def fn(params, grads, *, lr):
            for p, g in zip(params, grads):
                body(p, g, lr)

        generator = torch.Generator().manual_seed(18)
        lists = [[torch.randn(s, generator=generator) for s in shapes] for _ in range(2)]
        with pytest.raises(optjit.Error, match=message):
            fn(*lists, lr=0.1)

    refused(lambda p, g, lr: p.add_(g.sum().add_(g)), "writes a tensor's elements into a 0-d tensor")
    refused(lambda p, g, lr: p.fill_(g), "fill_ takes a number or a 0-d tensor")
    refused(
        lambda p, g, lr: p.add_(g.size(-2) * lr),
        r"size\(-2\) of an element of a list with a param of rank 1",
        shapes=((5,), (3, 6)),
    )


STEP_SCALE = 1.0  # read by _globally_scaled from the module: a new value records the step again


@optjit.step_function
def _globally_scaled(params, grads, *, lr):
    torch._foreach_add_(params, grads, alpha=-lr * STEP_SCALE)


def _compiled_and_eager(step, ours, theirs, what, dtype=torch.float32, **hypers):
    """One call compiled on `ours` and one eager on `theirs`, whose params then agree to `dtype`'s tolerance."""
    step(*ours, **hypers)
    step.eager(*theirs, **hypers)
    for k, (a, b) in enumerate(zip(ours[0], theirs[0])):
        assert_close(a, b, dtype, f"{what} params[{k}]")


def test_module_globals_and_closures_the_function_reads_record_again_when_they_change():
    global STEP_SCALE
    ours, theirs = _lists(torch.float32, 21, 2), _lists(torch.float32, 21, 2)
    for scale in (1.0, 1.0, 3.0):
        STEP_SCALE = scale
        _compiled_and_eager(_globally_scaled, ours, theirs, f"scale {scale}", lr=0.1)
    STEP_SCALE = 1.0

    beta = 0.9  # read by the step from its closure: a new value records again

    @optjit.step_function
    def momentum(params, grads, bufs, *, lr):
        torch._foreach_mul_(bufs, beta)
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-lr)

    ours, theirs = _lists(torch.float32, 22, 3), _lists(torch.float32, 22, 3)
    for value in (0.9, 0.5):
        beta = value
        _compiled_and_eager(momentum, ours, theirs, f"closure beta {value}", lr=0.1)

    # A global read inside a comprehension (code of its own) is guarded too.
    @optjit.step_function
    def per_tensor(params, grads, *, lr):
        torch._foreach_add_(params, torch._foreach_mul(grads, [STEP_SCALE for _ in grads]), alpha=-lr)

    ours, theirs = _lists(torch.float32, 25, 2), _lists(torch.float32, 25, 2)
    for scale in (1.0, 2.0):
        STEP_SCALE = scale
        _compiled_and_eager(per_tensor, ours, theirs, f"comprehension scale {scale}", lr=0.1)
    STEP_SCALE = 1.0


class _Signum:
    def __init__(self, beta):
        self.beta = beta

    @optjit.step_function
    def step(self, params, grads, bufs, *, lr):
        torch._foreach_lerp_(bufs, grads, 1 - self.beta)
        torch._foreach_add_(params, torch._foreach_sign(bufs), alpha=-lr)


def test_a_step_function_as_a_method_is_recorded_for_each_instance():
    ours, theirs = _lists(torch.float32, 23, 3), _lists(torch.float32, 23, 3)
    a, b = _Signum(0.9), _Signum(0.5)
    for _ in range(2):
        a.step(*ours, lr=0.1)
        _Signum.step.eager(a, *theirs, lr=0.1)
    assert a.step is a.step  # kept for the instance: one compiled step
    b.step(*ours, lr=0.1)
    _Signum.step.eager(b, *theirs, lr=0.1)
    a.beta = 0.7  # an attribute the step reads: recorded again
    a.step(*ours, lr=0.1)
    _Signum.step.eager(a, *theirs, lr=0.1)
    for x, y in zip(ours[0], theirs[0]):
        assert_close(x, y, torch.float32, "params")
    copied = copy.copy(a)  # a copy is an instance of its own
    assert copied.step is not a.step and copied.step.eager.args[0] is copied


def test_more_of_torchs_forms_and_refusals_that_say_why():
    import numpy as np

    params, grads = _lists(torch.float32, 24, 2)

    @optjit.step_function
    def clipped(params, grads, *, lr, max_norm):
        norms = torch.stack(torch._foreach_norm(grads))
        coef = torch.clamp(max_norm / (torch.linalg.vector_norm(norms) + 1e-6), max=1.0)
        mean = norms.mean()  # over the tensors
        scaled = torch._foreach_addcdiv(torch._foreach_mul(grads, 0.0), grads, params, norms)  # norms as scalars
        torch._foreach_mul_(scaled, coef)
        for p, g in zip(params, scaled):  # size() is the shape, as torch's
            p.sub_(g * (lr * mean * g.size()[-1] / g.size(-1)))

    # max_norm of inf only measures (no clipping), as torch takes it; numpy numbers are numbers.
    for max_norm in (float("inf"), np.float32(0.5)):
        ours, theirs = _clone([params])[0], _clone([params])[0]
        clipped(ours, grads, lr=np.float64(0.1), max_norm=max_norm)
        clipped.eager(theirs, grads, lr=0.1, max_norm=float(max_norm))
        for a, b in zip(ours, theirs):
            assert_close(a, b, torch.float32, f"max_norm {max_norm}")

    @optjit.step_function
    def branchy(params, grads, *, lr):
        if lr > 0:
            torch._foreach_add_(params, grads)

    with pytest.raises(optjit.Error, match="pass a value to branch on as a static argument"):
        branchy(params, grads, lr=0.1)

    @optjit.step_function
    def counted(params, grads, steps, *, lr):
        torch._foreach_add_(steps, grads)

    @optjit.step_function
    def stacked_wrongly(params, grads, *, lr):
        torch._foreach_addcmul_(params, torch.stack(torch._foreach_norm(grads)), grads)

    with pytest.raises(optjit.Error, match="addcmul with a torch.stack of per-tensor scalars"):
        stacked_wrongly(params, grads, lr=0.1)

    @optjit.step_function
    def same_shapes(params, grads, *, lr):
        if params[0].shape == grads[0].shape:
            torch._foreach_add_(params, grads, alpha=-lr)

    with pytest.raises(optjit.Error, match="comparing the shapes of list elements"):
        same_shapes(params, grads, lr=0.1)
    with pytest.raises(optjit.Error, match="keyword argument lr is 10000.*: it is beyond a float's range"):
        _globally_scaled(params, grads, lr=10**400)

    with pytest.raises(optjit.Error, match="writes tensors' elements into a list of 0-d tensors"):
        counted(params, grads, [torch.tensor(0.0) for _ in params], lr=0.1)

    before = _clone([params])[0]
    with pytest.raises(optjit.Error, match="positional argument 2 is float: positional arguments are tensor lists"):
        _globally_scaled(params, grads, 0.1)
    with pytest.raises(optjit.Error, match="entry 1 of positional argument 1 is None, not a tensor"):
        _globally_scaled(params, [grads[0], None, grads[2]], lr=0.1)
    complex_params = [torch.randn(3, dtype=torch.complex64)]
    with pytest.raises(optjit.Error, match="is a complex tensor: step functions compute on real numbers"):
        _globally_scaled(complex_params, [torch.randn(3, dtype=torch.complex64)], lr=0.1)
    assert all(torch.equal(a, b) for a, b in zip(params, before))


def test_a_value_kept_from_an_earlier_recording_is_refused_by_name():
    kept = {}

    @optjit.step_function
    def keeps(params, grads, *, lr, scale):
        if "grad" not in kept:
            kept["grad"] = grads[0]  # a symbolic value of this recording, kept past it
        torch._foreach_add_(params, torch._foreach_mul(grads, scale), alpha=-lr)

    @optjit.step_function
    def uses(params, grads, *, lr):
        torch._foreach_add_(params, [g + kept["grad"] for g in grads], alpha=-lr)

    params = [torch.zeros(3), torch.zeros(2)]
    grads = [torch.ones(3), torch.ones(2)]
    keeps(params, grads, lr=0.1, scale=1.0)
    before = [p.clone() for p in params]
    kept_by_keeps = "step function uses uses a value recorded by an earlier call of step function keeps"
    with pytest.raises(optjit.Error, match=kept_by_keeps):
        uses(params, grads, lr=0.1)
    assert all(torch.equal(p, b) for p, b in zip(params, before))


def test_a_scalar_kept_from_an_earlier_recording_is_refused_in_arithmetic():
    kept = []

    @optjit.step_function
    def step(params, grads, *, lr):
        kept.append(lr)
        bias = kept[0] * 2  # the first call's hyperparameter, read again in a later recording
        torch._foreach_add_(params, grads, alpha=-bias)

    params, grads = [torch.zeros(3)], [torch.ones(3)]
    step(params, grads, lr=0.1)
    with pytest.raises(optjit.Error, match="value recorded by an earlier call"):
        step([torch.zeros(4), torch.zeros(2)], [torch.ones(4), torch.ones(2)], lr=0.1)  # two tensors: records again


@pytest.mark.parametrize("param_dtype, state_dtype", [(torch.float32, torch.float64), (torch.bfloat16, torch.float64)])
def test_state_lists_wider_than_the_params_compute_as_torch_promotes_them(param_dtype, state_dtype):
    @optjit.step_function
    def momentum(params, grads, bufs, *, lr, beta):
        torch._foreach_mul_(bufs, beta)
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-lr)

    generator = torch.Generator().manual_seed(3)
    params = [torch.randn(40, generator=generator).to(param_dtype) for _ in range(2)]
    bufs = [torch.zeros(40, dtype=state_dtype) for _ in params]
    eager_params, eager_bufs = [p.clone() for p in params], [b.clone() for b in bufs]
    for _ in range(5):
        grads = [torch.randn(40, generator=generator).to(param_dtype) for _ in params]
        momentum(params, grads, bufs, lr=0.1, beta=0.9)
        momentum.eager(eager_params, grads, eager_bufs, lr=0.1, beta=0.9)
    for b, e in zip(bufs, eager_bufs):
        torch.testing.assert_close(b, e, rtol=1e-12, atol=1e-14)  # f64 state keeps f64 precision
    for p, e in zip(params, eager_params):
        torch.testing.assert_close(p, e, rtol=0, atol=0)


def test_what_torch_or_python_refuse_while_recording_is_an_optjit_error_naming_the_function():
    @optjit.step_function
    def makes_a_tensor(params, grads, *, lr):
        torch._foreach_add_(params, grads, alpha=-torch.tensor(lr).item())

    with pytest.raises(optjit.Error, match="step function makes_a_tensor raised RuntimeError while optjit recorded"):
        makes_a_tensor([torch.zeros(3)], [torch.ones(3)], lr=0.1)


def test_a_function_shared_by_param_groups_keeps_one_variant_per_group():
    @optjit.step_function
    def sgd(params, grads, *, lr):
        torch._foreach_add_(params, grads, alpha=-lr)

    groups = [[torch.zeros(3), torch.zeros(2)], [torch.zeros(5)]]
    for _ in range(4):
        for params in groups:
            sgd(params, [torch.ones_like(p) for p in params], lr=0.5)
    for params in groups:
        assert all(torch.equal(p, torch.full_like(p, -2.0)) for p in params)
    metrics = sgd.metrics()
    assert metrics["calls"] == 8 and metrics["compiles"] == 2 and metrics["cache_hits"] == 6, metrics
    assert metrics["records"] == 2 and metrics["rebuilds"] == 0 and metrics["variants"] == 2, metrics


def test_calls_that_alternate_between_more_variants_than_are_kept_warn_that_they_rebuild():
    @optjit.step_function
    def sgd(params, grads, *, lr):
        torch._foreach_add_(params, grads, alpha=-lr)

    groups = [[torch.zeros(k + 1)] for k in range(10)]
    with pytest.warns(UserWarning, match="compiled again"):
        for _ in range(2):
            for params in groups:
                sgd(params, [torch.ones_like(p) for p in params], lr=1.0)
    assert sgd.metrics()["rebuilds"] == 10 and sgd.metrics()["variants"] == 8
    assert all(torch.equal(p[0], torch.full_like(p[0], -2.0)) for p in groups)
