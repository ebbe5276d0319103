"""torch's lazy negation and conjugation bits: a tensor made by torch._neg_view, `.conj()` or `.conj().imag` shares
its memory with another and holds the negated or conjugated values there, which torch resolves as it reads and
writes. optjit steps such grads, params and state as torch does, and refuses where torch's step refuses (a
conjugate complex tensor where torch views complex tensors as real)."""

import pytest
import torch

import optjit
from conftest import assert_same_state, clone_params, make_params

SHAPES = [(5, 3), (7,)]


def negated_grad(p, generator):
    """A grad with the negation bit, as `.imag` of a conjugate complex tensor gives it."""
    real = torch.randn(p.shape, generator=generator, dtype=p.dtype)
    imag = torch.randn(p.shape, generator=generator, dtype=p.dtype)
    grad = torch.complex(real, imag).conj().imag
    assert grad.is_neg()
    return grad


@pytest.mark.parametrize(
    "cls, options",
    [(torch.optim.Adam, dict(lr=0.05)), (torch.optim.SGD, dict(lr=0.1, momentum=0.9)), (torch.optim.Adagrad, {})],
)
def test_grads_with_the_negation_bit_step_as_torch_steps_them(cls, options):
    params = make_params(torch.float32, shapes=SHAPES)
    twin = clone_params(params)
    opt, reference = cls(params, **options), cls(twin, **options)
    step = optjit.compile(opt)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p, q in zip(params, twin):
            p.grad = negated_grad(p, generator)
            q.grad = p.grad  # the same tensor: torch reads it as -memory too
        step()
        reference.step()
        assert_same_state(opt, params, reference, twin, torch.float32)


def test_the_same_negated_grad_changed_in_place_between_steps_is_read_again():
    params = make_params(torch.float32, shapes=SHAPES)
    twin = clone_params(params)
    opt, reference = torch.optim.SGD(params, lr=0.1), torch.optim.SGD(twin, lr=0.1)
    step = optjit.compile(opt)
    bases = [torch.complex(torch.randn(p.shape), torch.randn(p.shape)) for p in params]
    for p, q, base in zip(params, twin, bases):
        p.grad = base.conj().imag
        q.grad = p.grad
    for s in range(3):
        for base in bases:
            base.mul_(1.5 + s)  # the grads' values change under the same objects
        step()
        reference.step()
        assert_same_state(opt, params, reference, twin, torch.float32)


def test_state_with_the_negation_bit_is_stepped_and_written_back_through_it():
    params = make_params(torch.float32, shapes=SHAPES)
    twin = clone_params(params)
    opt, reference = torch.optim.Adam(params, lr=0.05), torch.optim.Adam(twin, lr=0.05)
    step = optjit.compile(opt)
    generator = torch.Generator().manual_seed(1)
    for s in range(4):
        for p, q in zip(params, twin):
            p.grad = torch.randn(p.shape, generator=generator)
            q.grad = p.grad.clone()
        if s == 1:  # exp_avg becomes a negated view of memory holding -exp_avg, in both optimizers
            for o, ps in ((opt, params), (reference, twin)):
                for p in ps:
                    value = o.state[p]["exp_avg"]
                    o.state[p]["exp_avg"] = torch._neg_view(value.neg())
        step()
        reference.step()
        assert_same_state(opt, params, reference, twin, torch.float32)
        for p in params:
            if s >= 1:
                assert opt.state[p]["exp_avg"].is_neg()  # still torch's tensor, still a view


def test_a_param_with_the_negation_bit_is_stepped_through_it():
    bases = [torch.complex(torch.randn(s), torch.randn(s)) for s in SHAPES]
    twin_bases = [b.clone() for b in bases]
    params = [torch.nn.Parameter(b.conj().imag) for b in bases]
    twin = [torch.nn.Parameter(b.conj().imag) for b in twin_bases]
    assert all(p.is_neg() for p in params)
    opt, reference = torch.optim.SGD(params, lr=0.1, momentum=0.9), torch.optim.SGD(twin, lr=0.1, momentum=0.9)
    step = optjit.compile(opt)
    generator = torch.Generator().manual_seed(2)
    for _ in range(3):
        for p, q in zip(params, twin):
            p.grad = torch.randn(p.shape, generator=generator)
            q.grad = p.grad.clone()
        step()
        reference.step()
        assert_same_state(opt, params, reference, twin, torch.float32)
        for b, c in zip(bases, twin_bases):  # the memory the params view holds what torch wrote there
            assert torch.allclose(b, c, rtol=1e-5, atol=1e-6)


def test_a_conjugate_complex_param_under_adam_is_refused_as_torch_refuses_it():
    param = torch.nn.Parameter(torch.randn(4, dtype=torch.complex64).conj())
    param.grad = torch.randn(4, dtype=torch.complex64)
    with pytest.raises(RuntimeError, match="view_as_real"):
        torch.optim.Adam([param], lr=0.1).step()
    before = param.detach().clone()
    with pytest.raises(optjit.Error, match="conjugate"):
        optjit.compile(torch.optim.Adam([param], lr=0.1))()
    assert torch.equal(param.detach(), before)


def test_a_conjugate_complex_grad_under_adam_is_refused_with_nothing_changed():
    param = torch.nn.Parameter(torch.randn(4, dtype=torch.complex64))
    param.grad = torch.randn(4, dtype=torch.complex64).conj()
    twin = torch.nn.Parameter(param.detach().clone())
    twin.grad = param.grad
    with pytest.raises(RuntimeError, match="view_as_real"):
        torch.optim.Adam([twin], lr=0.1).step()
    opt = torch.optim.Adam([param], lr=0.1)
    before = param.detach().clone()
    with pytest.raises(optjit.Error, match="conjugate"):
        optjit.compile(opt)()
    assert torch.equal(param.detach(), before) and not opt.state.get(param)


def test_a_conjugate_complex_grad_under_sgd_is_read_as_torch_reads_it():
    params = [torch.nn.Parameter(torch.randn(4, dtype=torch.complex64))]
    twin = [torch.nn.Parameter(params[0].detach().clone())]
    opt, reference = torch.optim.SGD(params, lr=0.1), torch.optim.SGD(twin, lr=0.1)
    step = optjit.compile(opt)
    for _ in range(2):
        grad = torch.randn(4, dtype=torch.complex64)
        params[0].grad = grad.conj()
        twin[0].grad = grad.conj()
        step()
        reference.step()
        torch.testing.assert_close(params[0].detach(), twin[0].detach())


def test_a_step_function_steps_negated_params_state_and_grads_as_its_eager_run():
    # Written one tensor at a time: torch's in-place foreach ops refuse lists with negated tensors ("materialize
    # all the negation input tensor(s)"), its tensor methods step them.
    @optjit.step_function
    def momentum(params, grads, bufs, *, lr, beta):
        for p, g, b in zip(params, grads, bufs):
            b.mul_(beta).add_(g)
            p.add_(b, alpha=-lr)

    def negated(values):
        """Tensors with the negation bit holding `values` (their memory holds -values)."""
        return [torch._neg_view(v.neg()) for v in values]

    generator = torch.Generator().manual_seed(4)
    start = [torch.randn(s, generator=generator) for s in SHAPES]
    params, eager_params = negated(start), negated(start)
    bufs, eager_bufs = negated([torch.zeros(s) for s in SHAPES]), negated([torch.zeros(s) for s in SHAPES])
    for _ in range(3):
        grads = negated([torch.randn(s, generator=generator) for s in SHAPES])
        momentum(params, grads, bufs, lr=0.1, beta=0.9)
        momentum.eager(eager_params, grads, eager_bufs, lr=0.1, beta=0.9)
        for a, b in zip(params + bufs, eager_params + eager_bufs):
            assert a.is_neg()
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
