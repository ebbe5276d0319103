"""Master weights from Python: a param group with "master_weights": True (optjit's group option, beside torch's) keeps
an f32 copy of each bf16/f16 param in torch's state (`master_param`). The step updates the master in f32 and rounds
the param from it, so a bf16 model follows torch's f32 optimizer on f32 params whose state (not params) is rounded to
bf16 after each step. A group of f32 params with the option is refused."""

import pytest
import torch

import optjit
from conftest import assert_kernels, make_params, set_grads

SHAPES = [(5, 3), (6,), (2, 3, 2), (), (0,)]
SCALAR_STATE = ("step", "mu_product", "eta", "mu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize(
    "cls,options",
    [(torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1)), (torch.optim.SGD, dict(lr=0.1, momentum=0.9))],
    ids=["AdamW", "SGD"],
)
def test_master_weights_follow_torch_f32_with_rounded_state(cls, options, dtype):
    params = make_params(dtype, seed=2, shapes=SHAPES)
    reference = [torch.nn.Parameter(p.detach().float()) for p in params]
    opt = cls([{"params": params, "master_weights": True}], **options)
    opt_ref = cls(reference, foreach=False, **options)
    step = optjit.compile(opt)
    for t in range(6):
        set_grads(t, params)
        for p, q in zip(params, reference):
            q.grad = None if p.grad is None else p.grad.float()
        step()
        opt_ref.step()
        with torch.no_grad():
            for q in reference:
                for key, value in opt_ref.state[q].items():
                    if key not in SCALAR_STATE:
                        value.copy_(value.to(dtype))
        for i, (p, q) in enumerate(zip(params, reference)):
            if p not in opt.state:
                continue
            master = opt.state[p]["master_param"]
            assert master.dtype == torch.float32
            torch.testing.assert_close(master, q.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"param {i}: {m}")
            assert torch.equal(p.detach(), master.to(dtype)), f"param {i} is rounded from its master"
    assert step.metrics()["compiles"] == 1
    assert_kernels(step, 1)


def test_master_weights_on_f32_params_are_refused():
    p = torch.nn.Parameter(torch.randn(4))
    p.grad = torch.randn(4)
    opt = torch.optim.Adam([{"params": [p], "master_weights": True}])
    with pytest.raises(optjit.Error, match=r"param 0 is f32\[4\] on cpu, in a group with master_weights=true"):
        optjit.compile(opt)()


@pytest.mark.parametrize("cls", [torch.optim.Adagrad, torch.optim.Adam], ids=["Adagrad", "Adam"])
def test_master_weights_turned_on_for_existing_state_start_from_the_param(cls):
    """Adagrad makes its state in its constructor, and a run may turn master weights on after some steps (or load
    a checkpoint saved without them): the master starts as an f32 copy of the param, in torch's state, and the
    group's new option recompiles (it is not one of torch's keys)."""
    params = make_params(torch.bfloat16, seed=4, shapes=[(5, 3), (6,)])
    opt = cls(params, lr=0.05)
    step = optjit.compile(opt)
    set_grads(0, params, none_every=0)
    step()
    opt.param_groups[0]["master_weights"] = True
    before = [p.detach().clone() for p in params]
    set_grads(1, params, none_every=0)
    step()
    for p, b in zip(params, before):
        master = opt.state[p]["master_param"]
        assert master.dtype == torch.float32
        assert torch.equal(p.detach(), master.to(torch.bfloat16))
        assert not torch.equal(p.detach(), b)  # stepped through its master
    assert "a param group gained or lost an option" in step.metrics()["recompile_reasons"][-1]
    assert all("master_param" in opt.state_dict()["state"][i] for i in range(len(params)))


def _bf16_run(steps_before, steps_after=0, resume=None):
    generator = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(300, generator=generator).to(torch.bfloat16))]
    opt = torch.optim.SGD([{"params": params, "master_weights": True}], lr=1e-3)
    step = optjit.compile(opt)
    if resume is not None:
        opt.load_state_dict(resume)  # after compiling: the checkpoint's f32 masters are kept
    for t in range(steps_before, steps_before + steps_after):
        params[0].grad = torch.randn(300, generator=torch.Generator().manual_seed(100 + t)).to(torch.bfloat16)
        step()
    return params, opt


def test_a_checkpoint_resumes_with_its_f32_masters():
    import copy

    uninterrupted, _ = _bf16_run(0, 6)
    _, first = _bf16_run(0, 3)
    saved = copy.deepcopy(first.state_dict())
    resumed, opt = _bf16_run(3, 3, resume=saved)
    assert opt.state[resumed[0]]["master_param"].dtype == torch.float32
    assert torch.equal(resumed[0], uninterrupted[0])  # torch's load_state_dict alone would cast the master to bf16


def test_a_param_written_outside_the_step_restarts_its_master():
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = torch.optim.SGD([{"params": [p], "master_weights": True}], lr=0.5)
    step = optjit.compile(opt)
    p.grad = torch.full((4,), 0.5, dtype=torch.bfloat16)
    step()  # 1 - 0.25
    with torch.no_grad():
        p.fill_(3.0)  # as model.load_state_dict or an EMA swap would
    p.grad = torch.zeros(4, dtype=torch.bfloat16)
    step()
    assert torch.equal(p, torch.full((4,), 3.0, dtype=torch.bfloat16))  # not the old master's 0.75
    opt.param_groups[0]["master_weights"] = False
    p.grad = torch.full((4,), 1.0, dtype=torch.bfloat16)
    step()  # 2.5, without the master
    opt.param_groups[0]["master_weights"] = True
    p.grad = torch.zeros(4, dtype=torch.bfloat16)
    step()
    assert torch.equal(p, torch.full((4,), 2.5, dtype=torch.bfloat16))  # the master restarts from 2.5, not 3.0


def test_a_param_written_after_loading_the_optimizer_restarts_its_master():
    import copy

    _, trained = _bf16_run(0, 2)
    checkpoint = copy.deepcopy(trained.state_dict())
    params, opt = _bf16_run(0, 0, resume=checkpoint)  # compiled, then the optimizer's state loaded
    with torch.no_grad():
        params[0].zero_()  # then the model's weights, as a resume that loads the model second does
    params[0].grad = torch.zeros(300, dtype=torch.bfloat16)
    optjit.compile(opt)()
    assert torch.equal(params[0], torch.zeros(300, dtype=torch.bfloat16))
