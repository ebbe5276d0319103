"""CUDA from Python, on a GPU (every case is skipped without one, with the reason, and ctest reports the file as
skipped): optjit.compile(opt) on CUDA params against torch's step in the same process, for default (host step counts),
capturable and fused optimizers, on a side stream, low precision against torch's fused steps, GradScaler, a tensor lr
on the device, and a step function. Where scalar state goes without a GPU: test_scalar_state_devices.py."""

import contextlib

import pytest
import torch

import optjit
from conftest import EVERY_OPTIMIZER, assert_kernels, assert_same_state, clone_params

FUSED = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here: runs where one is lent")


def _cuda_params(seed=0, shapes=((33, 7), (5,), (70001,), (0,), ())):
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=generator).cuda()) for s in shapes]


def _run_both(cls, kwargs, steps=5, stream=None, shapes=None):
    ours = _cuda_params() if shapes is None else _cuda_params(shapes=shapes)
    theirs = clone_params(ours)
    opt, ref = cls(ours, **kwargs), cls(theirs, **kwargs)
    step = optjit.compile(opt)
    for s in range(steps):
        generator = torch.Generator().manual_seed(s)
        for a, b in zip(ours, theirs):
            g = torch.randn(a.shape, generator=generator).cuda()
            a.grad, b.grad = g.clone(), g.clone()
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            step()
        ref.step()
    torch.cuda.synchronize()
    assert_same_state(opt, ours, ref, theirs, torch.float32)
    for a, b in zip(ours, theirs):  # and each entry where torch keeps it
        devices = {k: v.device for k, v in opt.state[a].items()}
        assert devices == {k: v.device for k, v in ref.state[b].items()}, f"optjit: {devices}"
    return opt, step


@gpu
@pytest.mark.parametrize("cls,kwargs", EVERY_OPTIMIZER, ids=[c.__name__ for c, _ in EVERY_OPTIMIZER])
def test_cuda_params_with_host_step_counts_match_torch(cls, kwargs):
    opt, step = _run_both(cls, kwargs)
    p = opt.param_groups[0]["params"][0]
    for key, value in opt.state[p].items():
        expected = "cuda" if value.dim() > 0 or cls is torch.optim.ASGD else "cpu"
        assert value.device.type == expected, f"{key} is on {value.device}"
    assert step.metrics()["compiles"] == 1


@gpu
def test_cuda_adafactor_rows_and_columns_match_torch():
    # Factored matrices (one block each: rows, columns), a batch of them, a single row and column, and a vector.
    shapes = [(300, 130), (3, 20, 17), (1, 257), (70, 1), (33,)]
    opt, step = _run_both(torch.optim.Adafactor, dict(lr=0.01, weight_decay=0.1), shapes=shapes)
    assert opt.state[opt.param_groups[0]["params"][0]]["row_var"].device.type == "cuda"
    assert step.metrics()["compiles"] == 1


@gpu
@pytest.mark.parametrize("flag", ["capturable", "fused"])
def test_cuda_capturable_and_fused_steps_match_torch(flag):
    opt, _ = _run_both(torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1, **{flag: True}))
    p = opt.param_groups[0]["params"][0]
    assert opt.state[p]["step"].device.type == "cuda"


@gpu
def test_cuda_clipping_matches_clip_grad_norm_and_its_norm_is_on_the_grads_device():
    ours = _cuda_params(seed=2)
    theirs = clone_params(ours)
    opt, ref = torch.optim.AdamW(ours, lr=0.01), torch.optim.AdamW(theirs, lr=0.01)
    step = optjit.compile(opt, max_grad_norm=1.0)
    norms = []
    for s in range(4):
        generator = torch.Generator().manual_seed(s)
        for a, b in zip(ours, theirs):
            g = torch.randn(a.shape, generator=generator).cuda()
            a.grad, b.grad = g.clone(), g.clone()
        expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        ref.step()
        step()
        assert step.total_norm.device == expected.device  # the first grad's device, as clip_grad_norm_'s
        torch.testing.assert_close(step.total_norm, expected, rtol=1e-5, atol=0)
        norms.append((step.total_norm, expected))
    # The norm stays on the device (the grad pass, the grad total kernel, the update), and each step's is its own.
    assert step.kernel_count == 3
    for ours_norm, expected in norms:
        torch.testing.assert_close(ours_norm, expected, rtol=1e-5, atol=0)
    torch.cuda.synchronize()
    assert_same_state(opt, ours, ref, theirs, torch.float32)


@gpu
def test_cuda_clipping_over_two_buckets_of_bf16_and_f32_matches_clip_grad_norm_on_the_device():
    generator = torch.Generator().manual_seed(5)
    ours = [torch.nn.Parameter(torch.randn(s, generator=generator).cuda()) for s in ((300, 40), (17,))]
    ours += [torch.nn.Parameter(torch.randn(s, generator=generator).cuda().bfloat16()) for s in ((64, 64), (3,))]
    theirs = clone_params(ours)

    def groups(ps):  # two buckets: f32 with weight decay, bf16 without
        return [{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0}]

    opt, ref = torch.optim.AdamW(groups(ours), lr=0.01), torch.optim.AdamW(groups(theirs), lr=0.01)
    step = optjit.compile(opt, max_grad_norm=0.5)
    for s in range(4):
        g = torch.Generator().manual_seed(10 + s)
        for a, b in zip(ours, theirs):
            grad = torch.randn(a.shape, generator=g).cuda().to(a.dtype)
            a.grad, b.grad = grad.clone(), grad.clone()
        expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
        ref.step()
        step()
        assert step.total_norm.dtype == expected.dtype
        torch.testing.assert_close(step.total_norm, expected, rtol=1e-2, atol=0)  # bf16's rounding of the norm
    assert step.kernel_count == 2 * 2 + 1
    torch.cuda.synchronize()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


@gpu
def test_a_step_on_a_side_stream_is_ordered_with_it():
    _run_both(torch.optim.Adam, dict(lr=0.01), stream=torch.cuda.Stream())


@gpu
def test_a_step_function_on_cuda_tensors():
    @optjit.step_function
    def sgd(params, grads, *, lr):
        torch._foreach_add_(params, grads, alpha=-lr)

    params, grads = [torch.ones(1000, device="cuda")], [torch.full((1000,), 2.0, device="cuda")]
    sgd(params, grads, lr=0.5)
    torch.testing.assert_close(params[0], torch.zeros(1000, device="cuda"))


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("cls", FUSED, ids=[c.__name__ for c in FUSED])
def test_cuda_low_precision_matches_torch_fused(cls, dtype):
    """bf16 and f16 params on the GPU: loaded, computed in f32 and rounded once per store, as torch's fused CUDA
    kernels do, within the golden low-precision budget."""
    from test_low_precision import CONFIGS, Budget

    options = dict(next(o for c, o in CONFIGS if c is cls))
    # Not Adam's weight decay here: torch's CUDA kernels are built by nvcc, which contracts grad + wd * param into one
    # FMA; optjit's kernels round every operation, as its CPU kernels do. Where grad cancels wd * param
    # to within a few eps, Adam's update lr * g / (|g| + eps) then differs by up to lr itself, far past any ulp budget
    # (seen on an H200: 1 element of 70,001 in f16, 8 ulp). The other configurations have no such cancellation.
    if cls is torch.optim.Adam:
        options.pop("weight_decay")
    params = [p.to(dtype) for p in _cuda_params(seed=5, shapes=((33, 7), (70001,), (5,), ()))]
    params = [torch.nn.Parameter(p.detach()) for p in params]
    reference = clone_params(params)
    opt, ref = cls(params, **options), cls(reference, fused=True, **options)
    step = optjit.compile(opt)
    budget = Budget(dtype)
    for t in range(6):
        generator = torch.Generator().manual_seed(t)
        for a, b in zip(params, reference):
            a.grad = torch.randn(a.shape, generator=generator).to(device="cuda", dtype=dtype)
            b.grad = a.grad.clone()
        step()
        try:
            ref.step()
        except RuntimeError as error:  # some torch versions fuse Adagrad on the CPU only
            if t == 0 and "fused" in str(error):
                pytest.skip(f"torch {torch.__version__} has no fused {cls.__name__} on CUDA: {error}")
            raise
        for i, (a, b) in enumerate(zip(params, reference)):
            budget.check(a.detach(), b.detach(), f"step {t} param {i}")
    budget.finish()
    assert step.metrics()["compiles"] == 1
    assert_kernels(step, 1)


@gpu
def test_cuda_grad_scaler_drives_a_patched_step_as_it_drives_torch_fused():
    """GradScaler('cuda') over a patched AdamW: the scale and found_inf go into the kernel, an inf step is skipped on
    the device, and params, state and scales follow AdamW(fused=True) under the same scaler."""

    def train(patched):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).cuda()
        params = list(model.parameters())
        opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, fused=not patched)
        compiled = optjit.patch(opt, fuse_unscale=True) if patched else None
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10, growth_interval=2)
        data = torch.Generator().manual_seed(1)
        scales = []
        for s in range(8):
            x, y = torch.randn(16, 8, generator=data).cuda(), torch.randn(16, 4, generator=data).cuda()
            opt.zero_grad()
            scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
            if s == 3:
                with torch.no_grad():
                    params[0].grad[0, 0] = float("inf")
            scales.append(scaler.get_scale())
            scaler.step(opt)
            scaler.update()
        return params, opt, scales, compiled

    params, opt, scales, compiled = train(patched=True)
    fused_params, fused_opt, fused_scales, _ = train(patched=False)
    assert scales == fused_scales and scales[4] == scales[0]  # grew at step 2, halved by the inf
    # torch's fused step keeps `step` on the GPU, its plain one (which optjit's patched AdamW follows) on the CPU.
    assert opt.state[params[0]]["step"].device.type == "cpu"
    for a, b in zip(params, fused_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        for key, value in opt.state[a].items():
            torch.testing.assert_close(value.cpu(), fused_opt.state[b][key].cpu(), rtol=1e-5, atol=1e-6)
    assert compiled.metrics()["skipped_steps"] == 1 and compiled.metrics()["compiles"] == 1


@gpu
def test_cuda_grad_scaler_skip_is_decided_by_the_kernels_of_a_capturable_step():
    """A capturable AdamW patched under GradScaler('cuda'): scale and found_inf stay on the GPU and the kernels skip
    the inf steps (the first one included, whose state stays, zeros and step 0, as torch's fused step leaves it), so
    params and state follow AdamW(fused=True) under the same scaler, and the host never counted a skip."""

    def train(patched):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).cuda()
        params = list(model.parameters())
        if patched:
            opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, capturable=True)
        else:
            opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, fused=True)
        compiled = optjit.patch(opt, fuse_unscale=True) if patched else None
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10, growth_interval=2)
        data = torch.Generator().manual_seed(1)
        for s in range(8):
            x, y = torch.randn(16, 8, generator=data).cuda(), torch.randn(16, 4, generator=data).cuda()
            opt.zero_grad()
            scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
            if s in (0, 3):
                with torch.no_grad():
                    params[0].grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
        return params, opt, compiled

    params, opt, compiled = train(patched=True)
    fused_params, fused_opt, _ = train(patched=False)
    for a, b in zip(params, fused_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert opt.state[a].keys() == fused_opt.state[b].keys()
        for key, value in opt.state[a].items():
            expected = fused_opt.state[b][key].cpu().float()
            torch.testing.assert_close(value.cpu().float(), expected, rtol=1e-5, atol=1e-6)
    assert compiled.metrics()["skipped_steps"] == 0 and compiled.metrics()["compiles"] == 1
    assert "found_inf (f32 on device)" in compiled.dump("fused")


@gpu
@pytest.mark.parametrize("max_grad_norm", [None, 0.5])
def test_cuda_grad_scaler_in_step_check_and_clipping_are_decided_on_the_device(max_grad_norm):
    """scaler.step(opt) on a capturable AdamW patched with fuse_inf_check (and clipping): the step checks its own
    grads, its grad total kernel writes found_inf and the clip coefficient on the GPU, and the kernels skip the inf
    steps (the first one included). Params, state and scales follow AdamW(fused=True) under GradScaler.unscale_ and
    clip_grad_norm_, and the host never counted a skip."""

    def train(patched):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).cuda()
        params = list(model.parameters())
        if patched:
            opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, capturable=True)
        else:
            opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, fused=True)
        compiled = optjit.patch(opt, max_grad_norm=max_grad_norm, fuse_inf_check=True) if patched else None
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10, growth_interval=2)
        data = torch.Generator().manual_seed(1)
        scales, norms = [], []
        for s in range(8):
            x, y = torch.randn(16, 8, generator=data).cuda(), torch.randn(16, 4, generator=data).cuda()
            opt.zero_grad()
            scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
            if s in (0, 3):
                with torch.no_grad():
                    params[0].grad[0, 0] = float("inf")
            if not patched and max_grad_norm is not None:
                scaler.unscale_(opt)
                norms.append(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
            scales.append(scaler.get_scale())
            scaler.step(opt)
            if patched and max_grad_norm is not None:
                norms.append(compiled.total_norm)
            scaler.update()
        return params, opt, compiled, scales, norms

    params, opt, compiled, scales, norms = train(patched=True)
    fused_params, fused_opt, _, fused_scales, fused_norms = train(patched=False)
    assert scales == fused_scales
    for s, (ours, theirs) in enumerate(zip(norms, fused_norms)):
        if s not in (0, 3):  # an inf step's norm is inf or NaN in both
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=0)
    for a, b in zip(params, fused_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert opt.state[a].keys() == fused_opt.state[b].keys()
        for key, value in opt.state[a].items():
            expected = fused_opt.state[b][key].cpu().float()
            torch.testing.assert_close(value.cpu().float(), expected, rtol=1e-5, atol=1e-6)
    assert compiled.metrics()["skipped_steps"] == 0 and compiled.metrics()["compiles"] == 1
    dumped = compiled.dump("fused")
    assert "found_inf (f32 on device)" in dumped
    assert ("clip_coef (f64 on device)" in dumped) == (max_grad_norm is not None)


@gpu
def test_cuda_tensor_lr_on_the_device_follows_a_scheduler():
    """A capturable Adam whose lr is a CUDA tensor, which StepLR fills in place: read at every step, never recompiled."""
    ours = _cuda_params()
    theirs = clone_params(ours)
    opt = torch.optim.Adam(ours, lr=torch.tensor(0.01, device="cuda"), capturable=True)
    ref = torch.optim.Adam(theirs, lr=torch.tensor(0.01, device="cuda"), capturable=True)
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (opt, ref)]
    step = optjit.compile(opt)
    for s in range(5):
        generator = torch.Generator().manual_seed(s)
        for a, b in zip(ours, theirs):
            a.grad = torch.randn(a.shape, generator=generator).cuda()
            b.grad = a.grad.clone()
        step()
        ref.step()
        for sched in scheds:
            sched.step()
    assert opt.param_groups[0]["lr"].device.type == "cuda"
    assert_same_state(opt, ours, ref, theirs, torch.float32)
    assert step.metrics()["compiles"] == 1



MUON_SHAPES = [(48, 20), (20, 48), (48, 20), (32, 32), (1, 40), (768, 3072)]


def _cuda_muon_grads(params, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=generator).cuda() for p in params]


@gpu
@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
def test_cuda_muon_products_in_cublas_match_torch():
    """torch.optim.Muon on CUDA matrices: optjit's kernels and its products in cuBLAS, on a side stream, against
    torch's own Muon on the GPU (its bf16 products in the same library, summed in its own order). The momentum is
    pointwise (both contract into fused multiply-adds on the GPU: within an f32 ulp); the params within the spread
    of bf16 Newton-Schulz."""
    ours = _cuda_params(seed=3, shapes=MUON_SHAPES)
    theirs = clone_params(ours)
    lr = 0.02
    opt, ref = torch.optim.Muon(ours, lr=lr, weight_decay=0.1), torch.optim.Muon(theirs, lr=lr, weight_decay=0.1)
    step = optjit.compile(opt)
    stream = torch.cuda.Stream()
    start = [p.detach().clone() for p in theirs]
    for s in range(4):
        for a, b, g in zip(ours, theirs, _cuda_muon_grads(ours, s)):
            a.grad, b.grad = g.clone(), g.clone()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        ref.step()
    torch.cuda.synchronize()
    for a, b, a0 in zip(ours, theirs, start):
        torch.testing.assert_close(opt.state[a]["momentum_buffer"], ref.state[b]["momentum_buffer"], rtol=1e-6, atol=1e-7)
        # The updates, which a wrong product changes wholly, within the spread of bf16 Newton-Schulz (a few percent);
        # the params alone would hide them under their own size.
        ours_update, theirs_update = (a - a0).double(), (b - a0).double()
        assert (ours_update - theirs_update).norm() < 0.05 * theirs_update.norm(), (a.shape, s)
    assert step.metrics()["compiles"] == 1
    assert step.metrics()["library_calls"] == step.library_call_count > 0


@gpu
@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
def test_cuda_muon_f32_iterations_match_newton_schulz_in_f64():
    from test_muon import _f32_muon_step

    params = _cuda_params(seed=4, shapes=MUON_SHAPES)
    grads = _cuda_muon_grads(params, 9)
    exact = [_f32_muon_step(p.detach().cpu(), g.cpu(), 0.02) for p, g in zip(params, grads)]
    opt = torch.optim.Muon([{"params": params, "f32_iterations": True}], lr=0.02, weight_decay=0.1)
    for p, g in zip(params, grads):
        p.grad = g
    optjit.compile(opt)()
    for p, e in zip(params, exact):
        update = 0.02 * 4  # the largest adjusted lr times an update element near 1
        # f32 rounding of the update, plus that of the params themselves (an ulp of |p| ~ 5 is 5e-7)
        bound = 1e-5 * update + 2 * torch.finfo(torch.float32).eps * e.abs().max()
        assert (p.detach().cpu() - e).abs().max() < bound


@gpu
@pytest.mark.parametrize("state_dtype", ["int8", "int4", "fp8"])
def test_cuda_quantized_state_steps_as_on_the_cpu(state_dtype):
    """state_dtype on CUDA params: the GPU kernels (a block per thread) against the CPU kernels on the same values.
    Both round in IEEE f32, so codes agree but where a contracted multiply-add moves a value across a code's
    boundary; the params follow within such a code's share of the update."""
    generator = torch.Generator().manual_seed(3)
    shapes = [(64, 128), (300,), (96, 512)]
    on_cpu = [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in shapes]
    on_gpu = [torch.nn.Parameter(p.detach().cuda()) for p in on_cpu]
    opts = [torch.optim.AdamW([{"params": ps, "state_dtype": state_dtype}], lr=0.01) for ps in (on_cpu, on_gpu)]
    steps = [optjit.compile(opt) for opt in opts]
    for s in range(4):
        grads = torch.Generator().manual_seed(100 + s)
        for a, b in zip(on_cpu, on_gpu):
            g = torch.randn(a.shape, generator=grads)
            a.grad, b.grad = g, g.cuda()
        for step in steps:
            step()
    torch.cuda.synchronize()
    for a, b in zip(on_cpu, on_gpu):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-4, atol=2e-4)
        for key, value in opts[0].state[a].items():
            other = opts[1].state[b][key].cpu()
            assert other.dtype == value.dtype, key
            if value.dtype in (torch.uint8, torch.float8_e4m3fn):
                differ = (value.view(torch.uint8) != other.view(torch.uint8)).float().mean().item()
                assert differ < 0.01, f"{key}: {differ:.2%} of the codes differ"
            else:
                torch.testing.assert_close(other, value, rtol=1e-4, atol=1e-6)
    assert steps[1].metrics()["compiles"] == 1
