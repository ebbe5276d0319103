"""optjit.compile on torchao 0.18's low-bit Adam and AdamW (AdamW8bit, AdamW4bit, AdamWFp8, ...) against torchao's
own step in the same process: every param bit, every code and every scale equal after each step, the state torchao's
own subclasses (OptimState8bit, OptimState4bit, OptimStateFp8) stepped zero-copy, so that either optimizer continues
from the other's state and checkpoints move between them."""

import io

import pytest
import torch
import torchao.optim as ao

import optjit

SHAPES = [(64, 64), (1000,)]  # quantized, and a small param that keeps plain state in its own dtype


def make_params(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g).to(dtype)) for shape in SHAPES]


def set_grads(params, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * [0.1, 1.0, 10.0][step % 3]).to(p.dtype)


def bits(t):
    t = t.detach()
    if t.dtype in (torch.uint8, torch.float8_e4m3fn):
        return t.view(torch.uint8)
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def state_tensors(state):
    out = {}
    for key, value in state.items():
        if hasattr(value, "codes"):
            out[key] = value.codes
            out[key + ".scale"] = value.scale
        else:
            out[key] = value
    return out


def assert_same(ours, theirs, ours_opt, theirs_opt):
    for k, (p, q) in enumerate(zip(ours, theirs)):
        assert torch.equal(bits(p), bits(q)), f"param {k}"
        mine, ref = state_tensors(ours_opt.state[p]), state_tensors(theirs_opt.state[q])
        assert mine.keys() == ref.keys(), (mine.keys(), ref.keys())
        for key in ref:
            assert mine[key].dtype == ref[key].dtype and mine[key].shape == ref[key].shape, (k, key)
            assert torch.equal(bits(mine[key]), bits(ref[key])), f"param {k} state {key}"


CASES = [
    ("AdamW8bit", torch.float32, {}),
    ("AdamW4bit", torch.float32, {}),
    ("AdamWFp8", torch.float32, {}),
    ("AdamW8bit", torch.bfloat16, {"lr": 1e-2, "weight_decay": 0.1}),
    ("Adam8bit", torch.float32, {"weight_decay": 0.01, "betas": (0.3, 0.6)}),
    # torchao computes in f32 whatever the params (p.float(), then p.copy_): f64 params and their plain state too.
    ("AdamW4bit", torch.float64, {"lr": 1e-2}),
    ("AdamW8bit", torch.float16, {}),
]


@pytest.mark.parametrize("name,dtype,options", CASES)
def test_compiled_torchao_optimizer_steps_as_torchao_bit_for_bit(name, dtype, options):
    ours, theirs = make_params(dtype), make_params(dtype)
    opt, ref = getattr(ao, name)(ours, **options), getattr(ao, name)(theirs, **options)
    step = optjit.compile(opt)
    for s in range(3):
        set_grads(ours, s)
        set_grads(theirs, s)
        step()
        ref.step()
        assert_same(ours, theirs, opt, ref)
    # The state is torchao's own: its subclasses for the large param, plain state in the param's dtype for the small.
    kind = "OptimState" + name.removeprefix("AdamW").removeprefix("Adam")
    assert type(opt.state[ours[0]]["exp_avg"]).__name__ == kind
    assert opt.state[ours[1]]["exp_avg"].dtype == dtype
    assert step.metrics()["compiles"] == 1


def test_an_lr_changed_in_its_tensor_steps_without_a_recompile_and_torchao_continues_from_optjits_state():
    ours, theirs = make_params(torch.float32), make_params(torch.float32)
    opt, ref = ao.AdamW8bit(ours), ao.AdamW8bit(theirs)
    step = optjit.compile(opt)
    for s in range(2):
        set_grads(ours, s)
        set_grads(theirs, s)
        step()
        ref.step()
    for group in opt.param_groups + ref.param_groups:
        group["lr"].fill_(3e-4)  # torchao's way (its lr is an f32 tensor)
    set_grads(ours, 2)
    set_grads(theirs, 2)
    step()
    ref.step()
    assert_same(ours, theirs, opt, ref)
    assert step.metrics()["compiles"] == 1
    # torchao's own step on the state optjit made and stepped, and optjit's on a state dict torchao saved.
    set_grads(ours, 3)
    set_grads(theirs, 3)
    opt.step()
    ref.step()
    assert_same(ours, theirs, opt, ref)
    copies = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    loaded = ao.AdamW8bit(copies)
    saved = io.BytesIO()
    torch.save(ref.state_dict(), saved)  # a checkpoint: torch's load_state_dict would share the codes otherwise
    saved.seek(0)
    loaded.load_state_dict(torch.load(saved, weights_only=True))
    loaded_step = optjit.compile(loaded)
    set_grads(copies, 4)
    set_grads(theirs, 4)
    loaded_step()
    ref.step()
    assert_same(copies, theirs, loaded, ref)


def test_what_optjit_cannot_follow_is_refused_by_name():
    with pytest.raises(optjit.Error, match="bf16_stochastic_round=True"):
        optjit.compile(ao.AdamW8bit(make_params(torch.bfloat16), bf16_stochastic_round=True))()
    ps = make_params(torch.float32)
    opt = ao.AdamW8bit(ps)
    set_grads(ps, 0)
    opt.step()  # torchao makes its state
    state = opt.state[ps[0]]["exp_avg"]
    state.qmap.copy_(torch.linspace(-1, 1, 256))  # a map of its own
    before = [p.detach().clone() for p in ps]
    with pytest.raises(optjit.Error, match="quantizes with its own map .* not torchao's signed8 map"):
        optjit.compile(opt)()
    assert all(torch.equal(p, b) for p, b in zip(ps, before))
