"""A tensor optjit steps whose memory changes under the same Python object (`t.data = other`, `t.set_(other)`,
`t.data.resize_`, `t.untyped_storage().resize_`) is stepped at its new memory, as torch steps it: optjit never
writes the memory torch freed. State tensors, grads, params and tensor hyperparameters alike."""

import pytest
import torch

import optjit
from conftest import assert_same_state, clone_params, make_params, set_grads

SHAPES = [(64, 32), (100,)]


def pair(cls=torch.optim.Adam, **options):
    params = make_params(torch.float32, shapes=SHAPES)
    twin = clone_params(params)
    return params, cls(params, **options), twin, cls(twin, **options)


def replace_data(t):
    t.data = t.data.clone() * 1.5


def replace_with_set(t):
    t.set_(t.detach().clone() * 1.5)


def grow_then_shrink(t):
    shape, values = t.shape, t.detach().clone()
    t.data.resize_(4 * t.numel() + 1024)  # a new, larger allocation; the old one is freed
    t.data.resize_(shape)
    t.data.copy_(values * 1.5)


def storage_freed_then_back(t):
    values = t.detach().clone()
    storage = t.untyped_storage()
    nbytes = storage.nbytes()
    storage.resize_(0)  # frees the memory
    filler = [torch.full((nbytes // 4 + 16,), 7.0) for _ in range(4)]  # lets the allocator hand it out again
    storage.resize_(nbytes)
    t.data.copy_(values * 1.5)
    del filler


CHANGES = [replace_data, replace_with_set, grow_then_shrink, storage_freed_then_back]


def step_both(cls, options, changed, change, grads_kept=False):
    """Steps a compiled and a torch optimizer of `cls` alike for 4 steps, applying `change` before the third to the
    tensors `changed(opt, params)` names in each (before the third and the fourth with `grads_kept`: the grads of the
    first two steps stay the same objects then); their params and state must agree after every step."""
    params, opt, twin, reference = pair(cls, **options)
    step = optjit.compile(opt)
    for s in range(4):
        if s < 2 or not grads_kept:
            set_grads(s, params, twin, none_every=0)
        if s == 2 or (s > 2 and grads_kept):
            for o, ps in ((opt, params), (reference, twin)):
                with torch.no_grad():
                    for t in changed(o, ps):
                        change(t)
        step()
        reference.step()
        assert_same_state(opt, params, reference, twin, torch.float32)


@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("key", ["exp_avg", "exp_avg_sq"])
def test_a_state_tensor_whose_memory_changed_is_stepped_at_its_new_memory(change, key):
    step_both(torch.optim.Adam, dict(lr=0.05, weight_decay=0.1), lambda o, ps: [o.state[p][key] for p in ps], change)


@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__)
def test_a_param_whose_memory_changed_is_stepped_at_its_new_memory(change):
    step_both(torch.optim.SGD, dict(lr=0.1, momentum=0.9), lambda o, ps: ps, change)


@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__)
def test_a_grad_whose_memory_changed_is_read_at_its_new_memory(change):
    # The same grad objects from the third step on, whose memory changes between steps.
    step_both(torch.optim.SGD, dict(lr=0.1, momentum=0.9), lambda o, ps: [p.grad for p in ps], change, True)


def test_a_state_tensor_given_a_shape_its_param_does_not_have_is_refused_with_nothing_changed():
    params, opt, _, _ = pair(torch.optim.Adam, lr=0.05)
    step = optjit.compile(opt)
    set_grads(0, params, none_every=0)
    step()
    with torch.no_grad():
        opt.state[params[0]]["exp_avg"].set_(torch.zeros(3))
    before = [p.detach().clone() for p in params]
    with pytest.raises(optjit.Error, match="exp_avg"):
        step()
    for p, b in zip(params, before):
        assert torch.equal(p.detach(), b)


def test_a_tensor_lr_whose_memory_changed_is_read_at_its_new_memory():
    params, opt, twin, reference = pair(torch.optim.Adam, lr=torch.tensor(0.05))
    step = optjit.compile(opt)
    for s in range(4):
        set_grads(s, params, twin, none_every=0)
        if s == 2:
            for o in (opt, reference):
                storage_freed_then_back_value(o.param_groups[0]["lr"], 0.01)
        step()
        reference.step()
        assert_same_state(opt, params, reference, twin, torch.float32)


def storage_freed_then_back_value(t, value):
    storage = t.untyped_storage()
    nbytes = storage.nbytes()
    storage.resize_(0)
    storage.resize_(nbytes)
    t.fill_(value)
