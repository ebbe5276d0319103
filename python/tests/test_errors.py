"""What optjit does not compile gets a clear optjit.Error naming it, and a bad step changes nothing."""

import pytest
import torch

import optjit
from conftest import make_params


def params():
    return make_params(torch.float32, shapes=[(3,), (2, 2)])


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda ps: torch.optim.LBFGS(ps), "optjit cannot compile LBFGS"),
        (lambda ps: torch.optim.SparseAdam(ps), "optjit cannot compile SparseAdam"),
        (lambda ps: torch.optim.Adam(ps, differentiable=True), "differentiable=True is not supported"),
    ],
)
def test_unsupported_optimizers_and_options(make, message):
    with pytest.raises(optjit.Error, match=message):
        optjit.compile(make(params()))


def test_not_an_optimizer():
    with pytest.raises(optjit.Error, match="takes a torch.optim.Optimizer, not list"):
        optjit.compile([])


def test_a_subclass_that_overrides_step():
    class Clipped(torch.optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    with pytest.raises(optjit.Error, match=r"Clipped overrides step\(\)"):
        optjit.compile(Clipped(params(), lr=0.1))


def test_a_subclass_that_keeps_step_compiles():
    class Named(torch.optim.SGD):
        pass

    ps = params()
    step = optjit.compile(Named(ps, lr=0.1))
    for p in ps:
        p.grad = torch.ones_like(p)
    step()
    assert step.metrics()["compiles"] == 1


def test_complex_params_with_fused_are_refused_as_torch_refuses_them():
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    p.grad = torch.ones_like(p)
    message = r"`fused=True` requires all the params to be floating point Tensors of supported devices"
    with pytest.raises(optjit.Error, match=message):
        optjit.compile(torch.optim.Adam([p], fused=True))()
    with pytest.raises(RuntimeError, match=message):
        torch.optim.Adam([p], fused=True).step()


def test_a_dtype_optjit_does_not_run_yet():
    with pytest.raises(optjit.Error, match="param 0 has dtype torch.float8_e4m3fn: optjit compiles torch.float32, "):
        optjit.compile(torch.optim.Adam([torch.nn.Parameter(torch.zeros(2, dtype=torch.float8_e4m3fn))]))()


def snapshot(opt, ps):
    return [p.detach().clone() for p in ps], {
        id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in ps if p in opt.state
    }


@pytest.mark.parametrize(
    "bad_grad,message",
    [
        (lambda p: torch.ones(5), "grad"),
        (lambda p: torch.ones_like(p, dtype=torch.float64), "grad"),
        (lambda p: torch.ones_like(p, dtype=torch.bfloat16), "is bf16.* but the param is f32"),
        (lambda p: torch.ones_like(p).to_sparse(), "not sparse ones"),
    ],
    ids=["shape", "dtype", "bf16 grad of an f32 param", "sparse"],
)
def test_a_bad_grad_raises_before_any_tensor_changes(bad_grad, message):
    ps = params()
    opt = torch.optim.Adam(ps, lr=0.1)
    step = optjit.compile(opt)
    for p in ps:
        p.grad = torch.ones_like(p)
    step()
    before = snapshot(opt, ps)
    ps[0].grad = torch.ones_like(ps[0])
    bad = bad_grad(ps[1])
    if bad.layout == torch.strided:
        ps[1].grad.data = bad  # torch checks `p.grad = ...`, not `p.grad.data = ...`
    else:
        ps[1].grad = bad
    with pytest.raises(optjit.Error, match=message):
        step()
    after = snapshot(opt, ps)
    for a, b in zip(before[0], after[0]):
        assert torch.equal(a, b)
    for key in before[1]:
        for k in before[1][key]:
            assert torch.equal(before[1][key][k], after[1][key][k])


def test_a_non_finite_hyperparameter_changes_nothing():
    ps = params()
    opt = torch.optim.SGD(ps, lr=0.1)
    step = optjit.compile(opt)
    for p in ps:
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in ps]
    opt.param_groups[0]["lr"] = float("nan")
    with pytest.raises(optjit.Error, match="lr"):
        step()
    for a, p in zip(before, ps):
        assert torch.equal(a, p.detach())


def test_a_subclass_that_makes_its_state_another_way_is_refused():
    """torch's step calls _init_group, which makes the state: a subclass overriding it changes the step."""

    class WarmAdam(torch.optim.Adam):
        def _init_group(self, group, *args):
            return super()._init_group(group, *args)

    with pytest.raises(optjit.Error, match=r"WarmAdam overrides _init_group\(\)"):
        optjit.compile(WarmAdam(params(), lr=0.1))


def test_capturable_on_the_cpu_is_refused_as_torch_refuses_it():
    message = "If capturable=True, params and state_steps must be on supported devices"
    ps = params()
    for p in ps:
        p.grad = torch.ones_like(p)
    with pytest.raises(AssertionError, match=message):
        torch.optim.Adam(ps, capturable=True).step()
    with pytest.raises(optjit.Error, match=message):
        optjit.compile(torch.optim.Adam(ps, capturable=True))()
    opt = torch.optim.Adam(ps)
    step = optjit.compile(opt)
    step()
    before = [p.detach().clone() for p in ps]
    opt.param_groups[0]["capturable"] = True  # set after compiling: checked at every step
    with pytest.raises(optjit.Error, match=message):
        step()
    assert all(torch.equal(b, p.detach()) for b, p in zip(before, ps))


@pytest.mark.parametrize(
    "cls,option,key",
    [(torch.optim.Adam, "amsgrad", "max_exp_avg_sq"), (torch.optim.RMSprop, "centered", "grad_avg")],
)
def test_an_option_that_adds_state_turned_on_later_is_refused_as_torch_refuses_it(cls, option, key):
    """torch's step raises KeyError for the entry its state lacks; optjit would keep it where state_dict cannot see
    it. Params and state stay as they were."""
    ps, twin = params(), params()
    for p, t in zip(ps, twin):
        p.grad, t.grad = torch.ones_like(p), torch.ones_like(t)
    opt, ref = cls(ps, lr=0.01), cls(twin, lr=0.01)
    step = optjit.compile(opt)
    step()
    ref.step()
    opt.param_groups[0][option] = ref.param_groups[0][option] = True
    with pytest.raises(KeyError, match=key):
        ref.step()
    before = [p.detach().clone() for p in ps]
    with pytest.raises(optjit.Error, match=f"has no '{key}'"):
        step()
    assert all(torch.equal(b, p.detach()) for b, p in zip(before, ps))
    assert key not in opt.state[ps[0]]
    opt.state.clear()  # as torch, it steps once the state is made afresh
    step()
    assert key in opt.state[ps[0]]


def test_numpy_scalars_are_numbers_as_torch_takes_them():
    np = pytest.importorskip("numpy")
    ps, twin = params(), params()
    for p, t in zip(ps, twin):
        p.grad, t.grad = torch.ones_like(p), torch.ones_like(t)
    opt = torch.optim.Adam(ps, lr=np.float32(0.01), betas=(np.float64(0.8), 0.9), amsgrad=np.bool_(False))
    ref = torch.optim.Adam(twin, lr=0.01, betas=(0.8, 0.9))
    step = optjit.compile(opt)
    step()
    ref.step()
    opt.param_groups[0]["lr"] = np.float32(0.02)
    ref.param_groups[0]["lr"] = float(np.float32(0.02))
    step()
    ref.step()
    for p, t in zip(ps, twin):
        torch.testing.assert_close(p.detach(), t.detach())


def _stepped_once(cls, **options):
    ps = params()
    opt = cls(ps, **options)
    step = optjit.compile(opt)
    for p in ps:
        p.grad = torch.ones_like(p)
    step()
    return ps, opt, step


def _unchanged(ps, opt):
    """A snapshot of the params and state, and a check that nothing differs from it."""
    before = [p.detach().clone() for p in ps], {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in ps}

    def check():
        for a, p in zip(before[0], ps):
            assert torch.equal(a, p.detach())
        for p in ps:
            for k, v in before[1][id(p)].items():
                assert torch.equal(v, opt.state[p][k]), k

    return check


def _group_edit(key, value):
    def edit(group):
        if value is KeyError:
            del group[key]
        else:
            group[key] = value

    return edit


@pytest.mark.parametrize(
    "cls, edit, torch_type",
    [
        (torch.optim.RAdam, _group_edit("betas", (0.9, 1.0)), ZeroDivisionError),
        (torch.optim.Adam, _group_edit("betas", (1.0, 0.999)), ZeroDivisionError),
        (torch.optim.Adamax, _group_edit("betas", (1.0, 0.999)), ZeroDivisionError),
        (torch.optim.Adam, _group_edit("betas", (0.9, 0.99, 0.5)), ValueError),
        (torch.optim.Adam, _group_edit("betas", (0.9,)), ValueError),
        (torch.optim.Adam, _group_edit("betas", 0.9), TypeError),
        (torch.optim.Rprop, _group_edit("etas", (0.5,)), ValueError),
        (torch.optim.Adam, _group_edit("betas", KeyError), KeyError),
        (torch.optim.SGD, _group_edit("momentum", KeyError), KeyError),
        (torch.optim.Adagrad, _group_edit("lr_decay", KeyError), KeyError),
    ],
)
def test_a_group_torchs_step_raises_on_raises_its_exception_type_with_nothing_changed(cls, edit, torch_type):
    options = dict(lr=0.1, momentum=0.9) if cls is torch.optim.SGD else dict(lr=0.1)
    # torch's own step raises that exception type on the same group.
    ps = params()
    reference = cls(ps, **options)
    for p in ps:
        p.grad = torch.ones_like(p)
    reference.step()
    edit(reference.param_groups[0])
    with pytest.raises(torch_type):
        reference.step()

    ps, opt, step = _stepped_once(cls, **options)
    edit(opt.param_groups[0])
    check = _unchanged(ps, opt)
    with pytest.raises(optjit.Error) as raised:
        step()
    assert isinstance(raised.value, torch_type)
    check()


def test_a_loaded_negative_step_count_is_refused_with_nothing_changed():
    ps, opt, step = _stepped_once(torch.optim.Adam, lr=0.1)
    saved = opt.state_dict()
    for entry in saved["state"].values():
        entry["step"] = torch.tensor(-1.0)
    opt.load_state_dict(saved)
    check = _unchanged(ps, opt)
    with pytest.raises(optjit.Error, match="step"):
        step()
    check()


def test_an_lr_beyond_the_params_dtype_is_refused_with_nothing_changed():
    ps, opt, step = _stepped_once(torch.optim.SGD, lr=0.1)
    opt.param_groups[0]["lr"] = 1e308
    check = _unchanged(ps, opt)
    with pytest.raises(optjit.Error, match="overflow"):
        step()
    check()


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.RAdam, torch.optim.Adafactor])
def test_state_in_another_dtype_than_its_param_is_refused_where_torch_refuses_it(cls):
    ps, opt, step = _stepped_once(cls, lr=0.1)
    key = "exp_avg" if cls is not torch.optim.Adafactor else "variance"
    target = next(p for p in ps if key in opt.state[p] and opt.state[p][key].dim() > 0)
    opt.state[target][key] = opt.state[target][key].double()
    check = _unchanged(ps, opt)
    with pytest.raises(optjit.Error, match="dtype"):
        step()
    check()


def test_state_in_a_wider_dtype_steps_as_torch_promotes_it_where_torch_steps():
    ps, opt, step = _stepped_once(torch.optim.SGD, lr=0.1, momentum=0.9)
    twin = [p.detach().clone().requires_grad_() for p in ps]
    reference = torch.optim.SGD(twin, lr=0.1, momentum=0.9)
    reference.load_state_dict(opt.state_dict())
    for o, group in ((opt, ps), (reference, twin)):
        for p in group:
            o.state[p]["momentum_buffer"] = o.state[p]["momentum_buffer"].double()
    for s in range(3):
        for p, q in zip(ps, twin):
            p.grad = torch.full_like(p, 0.1 * (s + 1))
            q.grad = p.grad.clone()
        step()
        reference.step()
    for p, q in zip(ps, twin):
        assert opt.state[p]["momentum_buffer"].dtype == torch.float64
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], reference.state[q]["momentum_buffer"])
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=0)


def test_malformed_arguments_are_optjit_errors():
    ps, opt, step = _stepped_once(torch.optim.SGD, lr=0.1)
    with pytest.raises(optjit.Error, match="grad_scaler is 5"):
        step(None, 5)
    with pytest.raises(optjit.Error, match="closure is 3"):
        step(3)
    with pytest.raises(optjit.Error, match="max_grad_norm is a tensor of 2 elements"):
        optjit.compile(opt, max_grad_norm=torch.tensor([1.0, 2.0]))


def test_dump_shows_the_compiled_step_while_a_bad_grad_waits_for_the_next_step():
    ps, opt, step = _stepped_once(torch.optim.SGD, lr=0.1)
    ps[0].grad.data = torch.ones(7)  # the wrong shape (torch checks `p.grad = ...` only): the next step refuses it
    with pytest.raises(optjit.Error):
        step()
    assert "kernel" in step.dump("fused")


def test_a_compiled_step_held_by_a_global_hook_at_exit_leaks_nothing():
    import subprocess
    import sys

    script = (
        "import torch, optjit\n"
        "from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook\n"
        "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)\n"
        "opt = torch.optim.Adam([p]); step = optjit.compile(opt); step()\n"
        "register_optimizer_step_post_hook(lambda o, a, k: step.metrics())\n"
        "@optjit.step_function\n"
        "def f(params, grads, *, lr):\n"
        "    torch._foreach_add_(params, grads, alpha=-lr)\n"
        "f([torch.zeros(2)], [torch.ones(2)], lr=0.1)\n"
        "register_optimizer_step_pre_hook(lambda o, a, k: f.metrics())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr, done.stderr


def test_a_refused_rebuild_retires_nothing_and_metrics_count_each_step_once():
    ps, opt, step = _stepped_once(torch.optim.Adam, lr=0.1)
    bad = torch.nn.Parameter(torch.zeros(3).to(torch.float8_e4m3fn))
    opt.add_param_group({"params": [bad]})
    for _ in range(2):
        with pytest.raises(optjit.Error, match="dtype"):
            step()
    opt.param_groups.pop()
    step()
    metrics = step.metrics()
    assert metrics["steps"] == 2 and metrics["compiles"] == 1, metrics
