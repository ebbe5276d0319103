"""bf16 and f16 torch params: optjit loads them, computes in f32 and rounds once per step when it stores (torch's
opmath, what its fused kernels do), for every optimizer. Checked two ways, as ../../tests/golden/next was recorded:
against torch's own f32 optimizer on f32 copies whose params and state are rounded to the dtype after every step
(the same semantics, exactly), and against torch's fused=True kernels where torch has them on the CPU. The bound is
the golden one: element-wise 4 and 2 ulp of the dtype, and at most 10% of the stored values differing at all."""

import pytest
import torch

import optjit
from conftest import assert_kernels, make_params, set_grads

EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
SHAPES = [(5, 3), (6,), (2, 3, 2), (), (0,)]
CONFIGS = [
    (torch.optim.Adam, dict(lr=0.05, amsgrad=True, weight_decay=0.1)),
    (torch.optim.AdamW, dict(lr=0.05, maximize=True)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (torch.optim.NAdam, dict(lr=0.05, decoupled_weight_decay=True, weight_decay=0.1)),
    (torch.optim.RAdam, dict(lr=0.05)),
    (torch.optim.Adamax, dict(lr=0.05)),
    (torch.optim.Adagrad, dict(lr=0.1, initial_accumulator_value=0.1, lr_decay=0.01)),
    (torch.optim.Adadelta, dict(lr=1.0)),
    (torch.optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.5)),
    (torch.optim.Rprop, dict(lr=0.01)),
    (torch.optim.ASGD, dict(lr=0.05, t0=2)),
]


class Budget:
    """The golden low-precision tolerance over a whole run."""

    def __init__(self, dtype):
        self.eps, self.counted, self.differing = EPS[dtype], 0, 0

    def check(self, got, expected, what):
        torch.testing.assert_close(
            got.float(), expected.float(), rtol=4 * self.eps, atol=2 * self.eps, msg=lambda m: f"{what}: {m}"
        )
        self.counted += got.numel()
        self.differing += int((got.float() != expected.float()).sum())

    def finish(self):
        assert self.differing <= 0.1 * self.counted, f"{self.differing} of {self.counted} stored values differ"


SCALAR_STATE = ("step", "mu_product", "eta", "mu")


def _round_in_place(opt, params, dtype):
    """Rounds f32 params and per-element state to `dtype` (and back to f32): one rounding per stored value."""
    with torch.no_grad():
        for p in params:
            p.copy_(p.to(dtype))
            for key, value in opt.state[p].items():
                if key not in SCALAR_STATE:
                    value.copy_(value.to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("cls,options", CONFIGS, ids=[c.__name__ for c, _ in CONFIGS])
def test_against_torch_f32_rounded_each_step(cls, options, dtype):
    params = make_params(dtype, seed=4, shapes=SHAPES)
    reference = [torch.nn.Parameter(p.detach().float()) for p in params]
    opt, opt_ref = cls(params, **options), cls(reference, **options)
    step = optjit.compile(opt)
    budget = Budget(dtype)
    for t in range(7):
        set_grads(t, params)
        for p, q in zip(params, reference):
            q.grad = None if p.grad is None else p.grad.float()
        step()
        opt_ref.step()
        _round_in_place(opt_ref, reference, dtype)
        for i, (p, q) in enumerate(zip(params, reference)):
            assert p.dtype == dtype
            budget.check(p.detach(), q.detach(), f"step {t} param {i}")
            assert list(opt.state[p]) == list(opt_ref.state[q])
            for key, value in opt_ref.state[q].items():
                got = opt.state[p][key]
                if key in SCALAR_STATE:
                    assert got.dtype == torch.float32, f"{key} is kept in f32, as torch keeps it"
                    torch.testing.assert_close(got, value, rtol=1e-6, atol=0)
                else:
                    assert got.dtype == dtype, f"state {key} is stored in the param's dtype"
                    budget.check(got, value, f"step {t} param {i} state {key}")
    budget.finish()
    assert step.metrics()["compiles"] == 1
    assert_kernels(step, 1)


FUSED = [c for c in CONFIGS if c[0] in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("cls,options", FUSED, ids=[c.__name__ for c, _ in FUSED])
def test_against_torch_fused(cls, options, dtype):
    params = make_params(dtype, seed=5, shapes=SHAPES)
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, opt_ref = cls(params, **options), cls(reference, fused=True, **options)
    step = optjit.compile(opt)
    budget = Budget(dtype)
    for t in range(7):
        set_grads(t, params, reference, none_every=0)  # fused SGD refuses a late first grad
        step()
        opt_ref.step()
        for i, (p, q) in enumerate(zip(params, reference)):
            budget.check(p.detach(), q.detach(), f"step {t} param {i}")
    budget.finish()
