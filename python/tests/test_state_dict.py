"""The state stays torch's: checkpoints written by plain torch resume under optjit and the other way round, and
load_state_dict after compiling rebinds instead of recompiling."""

import copy

import pytest
import torch

import optjit
from conftest import assert_same_state, clone_params, make_params, set_grads

CONFIGS = [
    (torch.optim.Adam, {"lr": 0.01, "amsgrad": True}),
    (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    (torch.optim.NAdam, {"lr": 0.01, "decoupled_weight_decay": True, "weight_decay": 0.1}),
    (torch.optim.ASGD, {"lr": 0.01, "t0": 2}),
    (torch.optim.Adagrad, {"lr": 0.1, "initial_accumulator_value": 0.1}),
    (torch.optim.Rprop, {"lr": 0.01}),
    (torch.optim.RMSprop, {"lr": 0.01, "centered": True, "momentum": 0.5}),
]


def run(opt, params, step, first, last):
    for t in range(first, last):
        set_grads(t, params)
        step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cls,kwargs", CONFIGS, ids=[c.__name__ for c, _ in CONFIGS])
@pytest.mark.parametrize("direction", ["torch_to_optjit", "optjit_to_torch"])
def test_a_checkpoint_continues_in_the_other(cls, kwargs, dtype, direction):
    params = make_params(dtype)
    opt = cls(params, **kwargs)
    first = optjit.compile(opt) if direction == "optjit_to_torch" else opt.step
    run(opt, params, first, 0, 3)
    checkpoint = opt.state_dict()  # the live tensors: each load below gets its own copy
    # A reference that never switches, and a run that resumes from the checkpoint on the other side.
    reference = clone_params(params)
    opt_ref = cls(reference, **kwargs)
    opt_ref.load_state_dict(copy.deepcopy(checkpoint))
    resumed = clone_params(params)
    opt_resumed = cls(resumed, **kwargs)
    opt_resumed.load_state_dict(copy.deepcopy(checkpoint))
    second = optjit.compile(opt_resumed) if direction == "torch_to_optjit" else opt_resumed.step
    for t in range(3, 7):
        set_grads(t, reference, resumed)
        opt_ref.step()
        second()
    assert_same_state(opt_resumed, resumed, opt_ref, reference, dtype)


@pytest.mark.parametrize("cls,kwargs", CONFIGS[:3], ids=[c.__name__ for c, _ in CONFIGS[:3]])
def test_load_state_dict_after_compiling_rebinds(cls, kwargs):
    params = make_params(torch.float32)
    opt = cls(params, **kwargs)
    step = optjit.compile(opt)
    run(opt, params, step, 0, 3)
    checkpoint = copy.deepcopy(opt.state_dict())  # state_dict() holds the live tensors
    run(opt, params, step, 3, 5)
    opt.load_state_dict(copy.deepcopy(checkpoint))  # new state tensors: the step binds to them
    reference = clone_params(params)
    opt_ref = cls(reference, **kwargs)
    opt_ref.load_state_dict(copy.deepcopy(checkpoint))
    for t in range(5, 8):
        set_grads(t, params, reference)
        step()
        opt_ref.step()
    assert_same_state(opt, params, opt_ref, reference, torch.float32)
    metrics = step.metrics()
    assert metrics["compiles"] == 1, metrics["recompile_reasons"]
    assert metrics["rebinds"] >= 2


def test_state_is_torchs_own_tensors_updated_in_place():
    params = make_params(torch.float32)
    opt = torch.optim.Adam(params, lr=0.01)
    step = optjit.compile(opt)
    assert len(opt.state) == 0  # created lazily, as torch does
    set_grads(0, params)
    step()
    state = opt.state[params[0]]
    assert list(state) == ["step", "exp_avg", "exp_avg_sq"]
    assert state["step"].dtype == torch.float32 and state["step"].dim() == 0 and float(state["step"]) == 1.0
    exp_avg = state["exp_avg"]
    before = exp_avg.clone()
    set_grads(1, params)
    step()
    assert opt.state[params[0]]["exp_avg"] is exp_avg  # the same tensor, updated in place
    assert not torch.equal(exp_avg, before)


@pytest.mark.parametrize("cls,kwargs", CONFIGS, ids=[c.__name__ for c, _ in CONFIGS])
def test_named_params_compile_and_their_state_dict_round_trips(cls, kwargs):
    """torch >= 2.6 takes named_parameters(): groups keep "param_names", which state_dict saves and loads."""
    params = make_params(torch.float32)
    twin = clone_params(params)
    opt = cls([(f"p{i}", p) for i, p in enumerate(params)], **kwargs)
    ref = cls([(f"p{i}", p) for i, p in enumerate(twin)], **kwargs)
    run(opt, params, optjit.compile(opt), 0, 3)
    run(ref, twin, ref.step, 0, 3)
    saved = opt.state_dict()
    assert saved["param_groups"][0]["param_names"] == [f"p{i}" for i in range(len(params))]
    assert_same_state(opt, params, ref, twin, torch.float32)
    # Into a fresh named optimizer (compiled before the load) and on: the same trajectory as torch's.
    resumed = cls([(f"p{i}", p) for i, p in enumerate(params)], **kwargs)
    step = optjit.compile(resumed)
    resumed.load_state_dict(copy.deepcopy(saved))
    assert resumed.state_dict()["param_groups"][0]["param_names"] == saved["param_groups"][0]["param_names"]
    run(resumed, params, step, 3, 6)
    run(ref, twin, ref.step, 3, 6)
    assert_same_state(resumed, params, ref, twin, torch.float32)


def test_a_non_tensor_step_loads_and_continues_as_in_torch():
    """torch's test_load_nontensor_step: a checkpoint whose step entries are Python floats."""
    params = make_params(torch.float32)
    twin = clone_params(params)
    opt, ref = torch.optim.Adam(params, lr=0.01), torch.optim.Adam(twin, lr=0.01)
    step = optjit.compile(opt)
    run(opt, params, step, 0, 2)
    run(ref, twin, ref.step, 0, 2)
    saved = copy.deepcopy(ref.state_dict())
    for entry in saved["state"].values():
        entry["step"] = float(entry["step"])
    opt.load_state_dict(copy.deepcopy(saved))
    ref.load_state_dict(saved)
    run(opt, params, step, 2, 5)
    run(ref, twin, ref.step, 2, 5)
    assert_same_state(opt, params, ref, twin, torch.float32)


@pytest.mark.parametrize(
    "edit",
    ["clear", "delete", "new dict", "replace an entry", "replace the step"],
)
def test_edits_to_opt_state_between_steps_are_followed_as_torch_follows_them(edit):
    """opt.state is torch's, and users edit it: clear it (a reset), delete or replace a param's dict, or put another
    tensor under a key. The next compiled step reads what is there, as torch's step does."""
    params = make_params(torch.float32, shapes=[(5,), (2, 3)])
    reference = clone_params(params)
    opt, ref = torch.optim.SGD(params, lr=0.1, momentum=0.9), torch.optim.SGD(reference, lr=0.1, momentum=0.9)
    if edit == "replace the step":
        opt, ref = torch.optim.Adam(params, lr=0.1), torch.optim.Adam(reference, lr=0.1)
    step = optjit.compile(opt)
    for t in range(4):
        set_grads(t, params, reference)
        if t == 2:
            for o, ps in ((opt, params), (ref, reference)):
                if edit == "clear":
                    o.state.clear()
                elif edit == "delete":
                    del o.state[ps[0]]
                elif edit == "new dict":
                    o.state[ps[1]] = {k: v.clone() * 0.5 for k, v in o.state[ps[1]].items()}
                elif edit == "replace an entry":
                    o.state[ps[0]]["momentum_buffer"] = torch.full_like(ps[0], 0.25)
                else:
                    o.state[ps[0]]["step"] = torch.tensor(10.0)
        step()
        ref.step()
    assert_same_state(opt, params, ref, reference, torch.float32)
