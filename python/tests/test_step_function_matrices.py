"""@optjit.step_function with matrix products: torch.optim.Muon's step written one tensor at a time with torch's own
calls (a bf16 copy, torch.mm as @, .T, torch.addmm) against torch.optim.Muon in the same process (the momentum
exact, the params within bf16 rounding) and as the built-in Muon's plan (3 kernels, 15 library calls); the same
step in f32 against its own eager run; and the products optjit cannot record refused with torch's rule named."""

import pytest
import torch

import optjit

pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")

NS_A, NS_B, NS_C = 3.4445, -4.7750, 2.0315
NS_STEPS = 5
SHAPES = [(4, 9), (6, 6), (1, 5), (3, 8)]  # wide and square: torch's Muon transposes tall ones, which a step records
# for every shape alike


def muon_update(params, grads, bufs, *, lr, momentum, weight_decay, eps):
    """torch.optim.Muon's _single_tensor_muon and _zeropower_via_newtonschulz for wide matrices, as torch writes them."""
    for p, g, buf in zip(params, grads, bufs):
        buf.lerp_(g, 1 - momentum)
        x = g.lerp(buf, momentum).to(dtype=torch.bfloat16, copy=True)
        x.div_(x.norm().clamp(min=eps))
        for _ in range(NS_STEPS):
            gram = x @ x.T
            update = torch.addmm(gram, gram, gram, beta=NS_B, alpha=NS_C)
            x = torch.addmm(x, update, x, beta=NS_A)
        p.mul_(1 - lr * weight_decay)
        p.add_(x, alpha=-lr)


def muon_update_f32(params, grads, bufs, *, lr, momentum, weight_decay, eps):
    """The same iterations in the lists' dtype, with torch.mm and Tensor.addmm spelled as methods."""
    for p, g, buf in zip(params, grads, bufs):
        buf.lerp_(g, 1 - momentum)
        x = g.lerp(buf, momentum)
        x = x / torch.linalg.vector_norm(x).clamp(min=eps)
        for _ in range(NS_STEPS):
            gram = torch.mm(x, x.mT)
            x = x.addmm(gram.addmm(gram, gram, beta=NS_B, alpha=NS_C), x, beta=NS_A)
        p.mul_(1 - lr * weight_decay).add_(x, alpha=-lr)


def _grads(step, dtype=torch.float32):
    generator = torch.Generator().manual_seed(50 + step)
    return [torch.randn(s, generator=generator, dtype=torch.float64).to(dtype) for s in SHAPES]


def test_muon_written_with_torch_mm_matches_torch_optim_muon():
    generator = torch.Generator().manual_seed(5)
    reference = [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in SHAPES]
    ours = [p.detach().clone() for p in reference]
    bufs = [torch.zeros(s) for s in SHAPES]
    torch_opt = torch.optim.Muon(reference, lr=0.02)  # adjusted lr: lr itself for wide and square matrices
    step = optjit.step_function(muon_update, name="muon")
    for t in range(4):
        grads = _grads(t)
        for p, g in zip(reference, grads):
            p.grad = g.clone()
        torch_opt.step()
        step(ours, grads, bufs, lr=0.02, momentum=0.95, weight_decay=0.1, eps=1e-7)
        for p, q, buf in zip(reference, ours, bufs):
            assert torch.equal(buf, torch_opt.state[p]["momentum_buffer"])
            # a few bf16 ulps of the update (elements near 1, times lr), per step
            torch.testing.assert_close(q, p.detach(), rtol=0, atol=2**-5 * 0.02 * (t + 1))
    assert step.kernel_count == 3 and step.library_call_count == 15  # the built-in Muon's plan
    assert step.metrics()["compiles"] == 1


def test_muon_in_f32_follows_its_eager_run():
    generator = torch.Generator().manual_seed(6)
    ours = [torch.randn(s, generator=generator) for s in SHAPES]
    reference = [p.clone() for p in ours]
    bufs, reference_bufs = [torch.zeros(s) for s in SHAPES], [torch.zeros(s) for s in SHAPES]
    step = optjit.step_function(muon_update_f32, name="muon_f32")
    for t in range(3):
        grads = _grads(t)
        step(ours, grads, bufs, lr=0.02, momentum=0.9, weight_decay=0.0, eps=1e-7)
        step.eager(reference, grads, reference_bufs, lr=0.02, momentum=0.9, weight_decay=0.0, eps=1e-7)
        for p, q in zip(ours, reference):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)  # f32 products in two libraries' orders
    assert "addmm \"nt f32\"" in step.dump("fused") or "mm \"nt f32\"" in step.dump("fused")


@pytest.mark.parametrize(
    "body, message",
    [
        (lambda x: x @ x, "the inner sizes n and m differ unless the param is square"),
        (lambda x: (x @ x.T) * 2, "on a matrix product's value of shape (m, m)"),
        (lambda x: x.T + 1, "a transposed element (x.T, x.mT) is used by"),
        (lambda x: x.bfloat16() @ x.T, "expected both operands to have the same dtype"),
        (lambda x: torch.addmm(x, x, x.T, beta=0.5), "torch.addmm adds a matrix of shape (m, n) to a product of shape"),
        (lambda x: x.to(torch.float16), "optjit records x.to(torch.bfloat16) and x.to(torch.float32)"),
    ],
    ids=["inner_sizes", "pointwise_on_gram", "transpose_pointwise", "mixed_dtypes", "addmm_shape", "other_dtype"],
)
def test_products_optjit_cannot_record_are_refused(body, message):
    def update(params, grads, *, lr):
        for p, g in zip(params, grads):
            p.add_(body(g), alpha=-lr)  # each body is refused before the store

    step = optjit.step_function(update, name="refused")
    params, grads = [torch.zeros(3, 5)], [torch.ones(3, 5)]
    with pytest.raises(optjit.Error, match=message.replace("(", r"\(").replace(")", r"\)")):
        step(params, grads, lr=0.1)
    assert torch.equal(params[0], torch.zeros(3, 5))

