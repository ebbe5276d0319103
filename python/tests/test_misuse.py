"""Misuse never crashes the interpreter: a step called from two threads at once, re-entered from its own hook, a
param replaced behind its back, a tensor on another device, an optimizer whose only reference is the step. Each
gives optjit.Error with nothing changed, or the documented behaviour. Copies and printing are torch's."""

import copy
import gc
import threading
import weakref

import pytest
import torch

import optjit
from conftest import make_params


def params():
    ps = make_params(torch.float32, shapes=[(4, 3), (5,)])
    for p in ps:
        p.grad = torch.randn_like(p)
    return ps


def values(opt, ps):
    state = [{k: v.clone() for k, v in opt.state[p].items()} for p in ps if p in opt.state]
    return [p.detach().clone() for p in ps], state


def assert_same(a, b):
    assert len(a[0]) == len(b[0]) and len(a[1]) == len(b[1])
    for x, y in zip(a[0], b[0]):
        assert torch.equal(x, y)
    for sa, sb in zip(a[1], b[1]):
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k])


def test_a_step_called_while_another_thread_steps_the_same_optimizer_is_refused():
    ps = params()
    opt = torch.optim.Adam(ps, lr=0.1)
    step = optjit.compile(opt)
    step()
    inside, release = threading.Event(), threading.Event()

    def hold(optimizer, args, kwargs):  # keeps the first call inside the step until the second has tried
        inside.set()
        release.wait(10)

    handle = opt.register_step_pre_hook(hold)
    first = threading.Thread(target=step)
    first.start()
    assert inside.wait(10)
    handle.remove()
    before = values(opt, ps)
    with pytest.raises(optjit.Error, match="already being stepped, from another thread"):
        optjit.compile(opt)()  # another compiled step of the same optimizer shares the lock
    assert_same(before, values(opt, ps))
    release.set()
    first.join()
    assert opt.state[ps[0]]["step"].item() == 2
    step()  # and the step works again afterwards
    assert opt.state[ps[0]]["step"].item() == 3


def test_a_step_re_entered_from_its_own_hook_is_refused():
    ps = params()
    opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
    step = optjit.patch(opt)
    opt.register_step_post_hook(lambda optimizer, args, kwargs: optimizer.step())
    with pytest.raises(optjit.Error, match="from a hook or closure of its own step"):
        step()


def test_steps_from_many_threads_one_at_a_time_each_count():
    ps = params()
    opt = torch.optim.Adam(ps, lr=0.1)
    step = optjit.compile(opt)
    lock = threading.Lock()

    def run():
        for _ in range(10):
            with lock:  # the caller serialises: every call runs
                step()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert opt.state[ps[0]]["step"].item() == 40


def test_a_param_replaced_in_its_group_is_stepped_as_torch_steps_it():
    ps = params()
    twin = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    for p, t in zip(ps, twin):
        t.grad = p.grad.clone()
    opt, ref = torch.optim.Adam(ps, lr=0.1), torch.optim.Adam(twin, lr=0.1)
    step = optjit.compile(opt)
    step()
    ref.step()
    new = torch.nn.Parameter(torch.randn(4, 3))
    new.grad = torch.randn(4, 3)
    new_twin = torch.nn.Parameter(new.detach().clone())
    new_twin.grad = new.grad.clone()
    start = new.detach().clone()
    opt.param_groups[0]["params"][0] = new  # the same list, one tensor replaced
    ref.param_groups[0]["params"][0] = new_twin
    step()
    ref.step()
    assert not torch.equal(new.detach(), start)  # the new param is the one stepped
    torch.testing.assert_close(new.detach(), new_twin.detach())
    torch.testing.assert_close(ps[1].detach(), twin[1].detach())
    assert opt.state[new]["step"].item() == 1
    assert "a param in the param groups was replaced" in step.metrics()["recompile_reasons"][-1]


def test_a_param_on_a_device_optjit_cannot_run_is_refused():
    p = torch.nn.Parameter(torch.zeros(3, device="meta"))
    with pytest.raises(optjit.Error, match="meta"):
        optjit.compile(torch.optim.Adam([p]))()


def test_the_compiled_step_holds_its_optimizer_as_torch_compile_does():
    ps = params()
    opt = torch.optim.Adam(ps, lr=0.1)
    step = optjit.compile(opt)
    alive = weakref.ref(opt)
    del opt
    gc.collect()
    assert alive() is not None  # documented: the step keeps its optimizer (and so its params) alive
    step()
    assert alive().state[ps[0]]["step"].item() == 1


def test_a_deep_copy_has_its_own_state_and_groups_and_is_patched_alike():
    ps = params()
    opt = torch.optim.Adam(ps, lr=0.1, amsgrad=True)
    optjit.patch(opt)
    opt.step()
    clone = copy.deepcopy(opt)
    assert clone.param_groups is not opt.param_groups
    for p, q in zip(opt.param_groups[0]["params"], clone.param_groups[0]["params"]):
        assert p is not q and torch.equal(p, q)
        for key in opt.state[p]:
            assert opt.state[p][key] is not clone.state[q][key]
            assert torch.equal(opt.state[p][key], clone.state[q][key])
    # torch's __getstate__ copies defaults, state and groups only; the copy of a patched optimizer is patched too,
    # with its own compiled step over its own params (torch's deepcopy test: the same public attributes).
    public = lambda o: {k for k in vars(o) if not k.startswith("_")}
    assert public(clone) == public(opt)
    assert clone.step.compiled is not opt.step.compiled
    for q in clone.param_groups[0]["params"]:
        q.grad = torch.ones_like(q)  # a Parameter's deep copy has no grad
    before = values(opt, ps)
    clone.step()
    assert_same(before, values(opt, ps))
    assert clone.step.compiled.metrics()["steps"] == 1
    optjit.unpatch(clone)
    clone.step()  # torch's own again
    assert clone.state[clone.param_groups[0]["params"][0]]["step"].item() == 3


def test_a_compiled_optimizer_prints_in_torchs_format():
    ps = params()
    opt = torch.optim.Adam(ps, lr=0.1)
    text = repr(opt)
    optjit.patch(opt)
    opt.step()
    assert repr(opt) == text
    assert text.startswith("Adam (\nParameter Group 0\n    amsgrad: False\n")


def test_a_step_hook_may_read_metrics_and_dumps_of_the_running_step():
    ps = params()
    opt = torch.optim.Adam(ps, lr=0.1)
    step = optjit.patch(opt)
    seen = []
    opt.register_step_post_hook(lambda optimizer, args, kwargs: seen.append((step.metrics()["steps"], step.kernel_count)))
    opt.step()
    opt.step()
    assert seen == [(1, 1), (2, 1)]
    assert "kernel" in step.dump("fused")


@pytest.mark.parametrize("new_shape", [(4_000_000,), (5,), (3, 4)])
def test_a_param_whose_data_takes_another_shape_is_refused_naming_it(new_shape):
    """`p.data = ...` of another size (an embedding resized) leaves torch's state of the old one: torch's step fails,
    and so does optjit's, with an Error naming the new shape, before anything is written (the kernels must never
    read past the old state). A reshape of the same memory, (3, 4) for a (4, 3) param, is seen as well."""
    ps = params()
    opt = torch.optim.Adam(ps, lr=0.1)
    step = optjit.compile(opt)
    step()
    ps[0].data = torch.ones(new_shape) if new_shape != (3, 4) else ps[0].data.reshape(3, 4)
    ps[0].grad = torch.ones(new_shape)
    before = values(opt, ps)
    shape = ", ".join(str(n) for n in new_shape)
    with pytest.raises(optjit.Error, match=rf"state 'exp_avg' of param 0 is f32\[4, 3\].*the param is now f32\[{shape}\]"):
        step()
    assert_same(values(opt, ps), before)


def test_patching_again_with_other_arguments_patches_with_them():
    ps = [torch.nn.Parameter(torch.zeros(3))]
    opt = torch.optim.SGD(ps, lr=1.0)
    first = optjit.patch(opt)
    assert optjit.patch(opt) is first  # the same arguments: the same compiled step
    clipped = optjit.patch(opt, max_grad_norm=0.1)
    assert clipped is not first
    ps[0].grad = torch.full((3,), 10.0)
    opt.step()
    torch.testing.assert_close(ps[0].detach(), torch.full((3,), -0.1 / 3**0.5), rtol=1e-5, atol=1e-6)
    optjit.unpatch(opt)
    assert "step" not in vars(opt)


def test_a_wrapper_tensor_subclass_param_is_refused_by_name():
    from torch.testing._internal.two_tensor import TwoTensor

    p = torch.nn.Parameter(TwoTensor(torch.ones(3), torch.full((3,), 2.0)))
    p.grad = TwoTensor(torch.ones(3), torch.ones(3))
    step = optjit.compile(torch.optim.Adam([p], lr=0.1))
    with pytest.raises(optjit.Error, match="TwoTensor'>, a tensor subclass with a dispatch of its own"):
        step()
    assert torch.equal(p.a, torch.ones(3)) and torch.equal(p.b, torch.full((3,), 2.0))


def test_a_step_counts_as_an_in_place_change_for_autograd():
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    other = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = torch.optim.SGD([w, other], lr=0.1)
    step = optjit.compile(opt)
    loss = (w * w).sum()  # saves w for backward
    w.grad = torch.ones(2)  # `other` has no grad: it is not stepped
    before = (w._version, other._version)
    step()
    assert (w._version, other._version) == (before[0] + 1, before[1])
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()  # as after torch's own step: the saved w is stale


def test_group_keys_that_are_not_options_are_ignored_as_torch_ignores_them():
    ours, theirs = make_params(torch.float32, shapes=[(4, 3)]), None
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    extra = {"name": "encoder", "lr_scale": 0.5, "layer_id": 3, "weight_decay": 0.1}  # Rprop has no weight decay
    opt = torch.optim.Rprop([dict(params=ours, **extra)], lr=0.01)
    ref = torch.optim.Rprop([dict(params=theirs, **extra)], lr=0.01)
    step = optjit.compile(opt)
    for _ in range(3):
        for a, b in zip(ours, theirs):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        step()
        ref.step()
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=1e-7)
    assert step.metrics()["compiles"] == 1
