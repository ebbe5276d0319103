"""optjit under PyTorch's own distributed engine, for real: 2 processes on this machine, gloo on the CPU.

- FSDP2 (fully_shard): params, grads and per-element state are DTensors; the compiled step updates each rank's local
  shards in place. Every optimizer runs 10 steps through optjit.patch and through torch's own step, from the same
  model and data; every rank's shards and state must agree. The last layer's bias has one element, so rank 1's
  shard of it is empty.
- A checkpoint taken with torch.distributed.checkpoint's get_optimizer_state_dict from a plain torch run loads with
  set_optimizer_state_dict into a compiled run (torch steps the optimizer once with lr 0 to create its state, then
  loads), which continues the plain run's trajectory.
- A step function's norms over FSDP2 shards: each process's partials are all-reduced over the mesh between kernels.
- DDP: plain tensors whose grads are all-reduced in backward; the compiled step needs nothing special.
- torch.optim.Muon over FSDP2's shards (split along rows, then along columns): each matrix gathered to its owner,
  orthogonalized whole, scattered back, in two all_to_alls per step; equal to Muon on the unsharded model.

Each scenario is one torch.multiprocessing.spawn, so that torch is imported twice per scenario, not per case."""

import copy
import datetime
import gc
import os
import tempfile
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import optjit

WORLD = 2
STEPS = 10

CONFIGS = [
    (torch.optim.Adam, dict(lr=1e-2, amsgrad=True)),
    (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    (torch.optim.SGD, dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    (torch.optim.NAdam, dict(lr=1e-2, decoupled_weight_decay=True, weight_decay=0.1)),
    (torch.optim.RAdam, dict(lr=1e-2)),
    (torch.optim.Adamax, dict(lr=1e-2)),
    (torch.optim.Adagrad, dict(lr=1e-2, lr_decay=0.01)),
    (torch.optim.Adadelta, dict(lr=1.0)),
    (torch.optim.RMSprop, dict(lr=1e-2, centered=True, momentum=0.5)),
    (torch.optim.Rprop, dict(lr=1e-2)),
    (torch.optim.ASGD, dict(lr=1e-2, t0=3)),
]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _fsdp_model(mesh, shard_placement_fn=None, make=None):
    from torch.distributed.fsdp import fully_shard

    model = (make or _model)()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, shard_placement_fn=shard_placement_fn)
    return fully_shard(model, mesh=mesh, shard_placement_fn=shard_placement_fn)


def _weights_on_dim_1(param):
    """FSDP2's shard_placement_fn: matrices split along their columns (Shard(1)), vectors along dim 0."""
    from torch.distributed.tensor import Shard

    return Shard(1) if param.dim() == 2 else None


def _train(model, opt, rank, steps, first=0, clip=None):
    for t in range(first, first + steps):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * rank + t))
        model(x).square().mean().backward()
        if clip is not None:
            clip()
        opt.step()
        opt.zero_grad()


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _assert_same_run(model, opt, reference, opt_ref, what):
    """Each rank's local params and state entries agree with the reference run's (keys, types, values). Params at
    the golden f32 tolerance; state at 1e-4: centered RMSprop's buffers divide by sqrt(E[g^2] - E[g]^2), which
    cancels and magnifies f32 rounding where an FMA or a summation order differs from torch's loop."""
    for i, (p, q) in enumerate(zip(model.parameters(), reference.parameters())):
        assert type(p) is type(q), f"{what}: param {i} is a {type(p).__name__}, torch's a {type(q).__name__}"
        torch.testing.assert_close(
            _local(p.detach()), _local(q.detach()), rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: param {i}: {m}"
        )
        state, state_ref = opt.state[p], opt_ref.state[q]
        assert list(state) == list(state_ref), f"{what}: param {i} state keys {list(state)} vs {list(state_ref)}"
        for key, value in state_ref.items():
            assert type(state[key]) is type(value), f"{what}: param {i} state {key}: {type(state[key]).__name__}"
            torch.testing.assert_close(
                _local(state[key]), _local(value), rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: param {i} {key}: {m}"
            )


def _fsdp_every_optimizer(rank, mesh):
    for cls, options in CONFIGS:
        reference = _fsdp_model(mesh)
        opt_ref = cls(reference.parameters(), **options)
        _train(reference, opt_ref, rank, STEPS)

        model = _fsdp_model(mesh)
        opt = cls(model.parameters(), **options)
        compiled = optjit.patch(opt)
        _train(model, opt, rank, STEPS)
        _assert_same_run(model, opt, reference, opt_ref, f"rank {rank}, FSDP2 {cls.__name__}")
        metrics = compiled.metrics()
        assert metrics["steps"] == STEPS and metrics["compiles"] == 1 and metrics["recompiles"] == 0, metrics
        assert metrics["kernels"] == 1, metrics
        shards = [p.to_local().numel() for p in model.parameters()]
        assert (shards[-1] == 0) == (rank == 1), shards  # the empty shard was stepped too


def _fsdp_checkpoint_resumes(rank, mesh):
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    reference = _fsdp_model(mesh)
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    _train(reference, opt_ref, rank, STEPS // 2)
    checkpoint = {
        "model": {k: v.detach().clone() for k, v in reference.state_dict().items()},
        "optim": copy.deepcopy(get_optimizer_state_dict(reference, opt_ref)),  # it holds the live state
    }
    _train(reference, opt_ref, rank, STEPS // 2, first=STEPS // 2)

    model = _fsdp_model(mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    compiled = optjit.patch(opt)
    model.load_state_dict(checkpoint["model"])
    set_optimizer_state_dict(model, opt, checkpoint["optim"])
    _train(model, opt, rank, STEPS // 2, first=STEPS // 2)
    _assert_same_run(model, opt, reference, opt_ref, f"rank {rank}, FSDP2 checkpoint")
    assert compiled.metrics()["recompiles"] == 0


def _ddp(rank, mesh):
    from torch.nn.parallel import DistributedDataParallel

    for cls, options in CONFIGS[:3]:
        reference = DistributedDataParallel(_model())
        opt_ref = cls(reference.parameters(), **options)
        _train(reference, opt_ref, rank, STEPS)
        model = DistributedDataParallel(_model())
        opt = cls(model.parameters(), **options)
        optjit.patch(opt)
        _train(model, opt, rank, STEPS)
        _assert_same_run(model, opt, reference, opt_ref, f"rank {rank}, DDP {cls.__name__}")
        for p in model.parameters():  # all-reduced grads keep the replicas equal
            gathered = [torch.empty_like(p) for _ in range(WORLD)]
            dist.all_gather(gathered, p.detach())
            assert all(torch.equal(g, gathered[0]) for g in gathered), "DDP replicas diverged"


def _fsdp_clipping(rank, mesh):
    """max_grad_norm over FSDP2 shards: the norm is the whole model's (each process's partial all-reduced over the
    mesh), as clip_grad_norm_ computes it on DTensors, with clipping active; also with weights split along their
    columns (Shard(1)) beside biases split along dim 0. (The 2-norm: torch's own inf-norm raises on rank 1's empty
    shard of the last bias.) Adafactor, whose reductions span the shards, is refused (torch 2.15's own Adafactor
    raises over FSDP2 shards: its column sums make Partial DTensors that its in-place ops refuse)."""
    for norm_type, placement_fn in ((2.0, None), (2.0, _weights_on_dim_1)):
        max_norm = 0.05
        reference = _fsdp_model(mesh, placement_fn)
        opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
        norms = []

        def clip():
            norms.append(torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm, norm_type=norm_type))

        _train(reference, opt_ref, rank, STEPS, clip=clip)
        model = _fsdp_model(mesh, placement_fn)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        compiled = optjit.patch(opt, max_grad_norm=max_norm, norm_type=norm_type)
        _train(model, opt, rank, STEPS)
        what = f"rank {rank}, FSDP2 AdamW clipped ({norm_type}{', weights on dim 1' if placement_fn else ''})"
        _assert_same_run(model, opt, reference, opt_ref, what)
        last = norms[-1].full_tensor() if hasattr(norms[-1], "full_tensor") else norms[-1]
        assert float(last) > max_norm, what  # clipping was active
        ours = compiled.total_norm
        assert type(ours) is type(norms[-1]), f"{what}: total_norm is a {type(ours)}, torch's a {type(norms[-1])}"
        ours = ours.full_tensor() if hasattr(ours, "full_tensor") else ours
        assert ours.device == last.device, what
        torch.testing.assert_close(ours.float(), last.float(), rtol=1e-5, atol=0)
    model = _fsdp_model(mesh)
    opt = torch.optim.Adafactor(model.parameters(), lr=1e-2)
    optjit.patch(opt)
    model(torch.randn(4, 8)).square().mean().backward()
    try:
        opt.step()
    except optjit.Error as e:
        assert "its row, column and RMS reductions span the shards" in str(e), e
    else:
        raise AssertionError("Adafactor over FSDP2 shards was not refused")


@optjit.step_function
def _trust_clipped(params, grads, *, lr, max_norm):
    """Clipping by the global grad norm and LAMB's per-tensor trust ratio: norms that span the shards."""
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    trust = torch._foreach_div(torch._foreach_norm(params), torch._foreach_add(torch._foreach_norm(grads), 1e-6))
    updates = torch._foreach_mul(grads, trust)
    torch._foreach_mul_(updates, coef)
    torch._foreach_add_(params, updates, alpha=-lr)


def _fsdp_step_functions(rank, mesh):
    """Step functions over FSDP2 shards. Their norms are the whole tensors' (each process's partials all-reduced over
    the mesh, as torch reduces the Partial DTensors its eager run makes): 10 steps compiled equal fn.eager's on the
    same DTensors, with clipping active, also with weights split along their columns. torch's foreach_map Adam equals
    torch.optim.Adam; new grad DTensors each step are read, not the freed ones; a mean, whose size spans the shards, is
    refused, and so are norms over shards beside a plain tensor."""
    for placement_fn in (None, _weights_on_dim_1):
        runs = []
        for compiled in (False, True):
            model = _fsdp_model(mesh, placement_fn)
            params = [p.detach() for p in model.parameters()]
            step = _trust_clipped if compiled else _trust_clipped.eager
            for t in range(STEPS):
                x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * rank + t))
                model(x).square().mean().backward()
                with torch.no_grad():
                    step(params, [p.grad for p in model.parameters()], lr=0.05, max_norm=0.05)
                model.zero_grad()
            runs.append(model)
        what = f"rank {rank}, FSDP2 step function{' with weights on dim 1' if placement_fn else ''}"
        for i, (p, q) in enumerate(zip(runs[1].parameters(), runs[0].parameters())):
            torch.testing.assert_close(
                _local(p.detach()), _local(q.detach()), rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: param {i}: {m}"
            )
        assert _trust_clipped.kernel_count == 2, what

    # torch's foreach_map Adam recipe as a step function, its state made as torch makes it (zeros_like of each
    # DTensor param, plain 0-d step counts), equals torch.optim.Adam over the same shards.
    from test_step_function import foreach_map_adam

    reference = _fsdp_model(mesh)
    opt_ref = torch.optim.Adam(reference.parameters(), lr=1e-2, betas=(0.8, 0.95))
    _train(reference, opt_ref, rank, STEPS)
    model = _fsdp_model(mesh)
    params = [p.detach() for p in model.parameters()]
    state = [[torch.zeros_like(p) for p in params] for _ in range(2)] + [[torch.tensor(0.0) for _ in params]]

    class _Stepper:  # _train's optimizer: the step function over the model's lists
        def step(self):
            grads = [p.grad for p in model.parameters()]
            foreach_map_adam(params, grads, *state, lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-8)

        def zero_grad(self):
            model.zero_grad()

    _train(model, _Stepper(), rank, STEPS)
    for i, (p, q) in enumerate(zip(model.parameters(), reference.parameters())):
        torch.testing.assert_close(
            _local(p.detach()), _local(q.detach()), rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {rank}, Adam {i}: {m}"
        )
        torch.testing.assert_close(_local(state[0][i]), _local(opt_ref.state[q]["exp_avg"]), rtol=1e-4, atol=1e-5)

    # New grad DTensors each step, the last ones freed while their local tensors live on: a new grad may take a freed
    # one's id(), and a DTensor's own data_ptr() is 0, so only its local tensor's address tells the grads apart.
    from torch.distributed.tensor import DTensor

    @optjit.step_function
    def signed(params, grads, *, lr):
        torch._foreach_add_(params, torch._foreach_sign(grads), alpha=-lr)

    params = [p.detach() for p in _fsdp_model(mesh).parameters()]
    reference = [p.clone() for p in params]
    kept = []
    for t in range(STEPS):
        generator = torch.Generator().manual_seed(100 * rank + t)
        grads = [
            DTensor.from_local(
                torch.randn(p.to_local().shape, generator=generator),
                p.device_mesh,
                p.placements,
                run_check=False,
                shape=p.shape,
                stride=p.stride(),
            )
            for p in params
        ]
        signed(params, grads, lr=0.01)
        signed.eager(reference, grads, lr=0.01)
        kept += [g.to_local() for g in grads]
        del grads
    for i, (p, q) in enumerate(zip(params, reference)):
        torch.testing.assert_close(
            _local(p), _local(q), rtol=0, atol=0, msg=lambda m: f"rank {rank}, new grads: {i}: {m}"
        )

    # A plain tensor beside the shards: refused before the step changes anything (its first kernel could write).
    mixed = [p.detach() for p in _fsdp_model(mesh).parameters()] + [torch.ones(3)]
    before = [_local(p).clone() for p in mixed]
    try:
        _trust_clipped(mixed, [p.clone() for p in mixed], lr=0.1, max_norm=0.05)
    except optjit.Error as e:
        assert "not all split along the same dimensions of one device mesh" in str(e), e
    else:
        raise AssertionError("a step function's norms over shards and a plain tensor were not refused")
    assert all(torch.equal(_local(p), b) for p, b in zip(mixed, before))

    @optjit.step_function
    def mean_scaled(params, grads, *, lr):
        torch._foreach_add_(params, torch._foreach_mul(grads, [g.mean() for g in grads]), alpha=-lr)

    model = _fsdp_model(mesh)
    model(torch.randn(4, 8)).square().mean().backward()
    try:
        mean_scaled([p.detach() for p in model.parameters()], [p.grad for p in model.parameters()], lr=0.1)
    except optjit.Error as e:
        assert "a tensor's size (numel, size(-1), size(-2)) spans the shards too" in str(e), e
    else:
        raise AssertionError("a step function's mean over FSDP2 shards was not refused")


def _fsdp_fused_inf_check(rank, mesh):
    """GradScaler with the step's own inf check over FSDP2 shards: an inf in rank 0's shard only skips the step on
    every rank (found_inf is all-reduced, as torch's DTensor check does), so the run equals torch's GradScaler path."""

    def run(patched):
        model = _fsdp_model(mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        if patched:
            optjit.patch(opt, fuse_inf_check=True)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
        for t in range(6):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * rank + t))
            scaler.scale(model(x).square().mean()).backward()
            if t == 3 and rank == 0:
                with torch.no_grad():
                    next(model.parameters()).grad.to_local()[0, 0] = float("inf")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        return model, opt, scaler

    model, opt, scaler = run(True)
    reference, opt_ref, scaler_ref = run(False)
    assert scaler.get_scale() == scaler_ref.get_scale(), (scaler.get_scale(), scaler_ref.get_scale())
    _assert_same_run(model, opt, reference, opt_ref, f"rank {rank}, FSDP2 AdamW with the fused inf check")


def _muon_model():
    """Matrices only (Muon's params): tall 16x8, wide 5x16 (uneven row shards), square 5x5, and 1x5 (rank 1's row
    shard empty)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16, bias=False),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 5, bias=False),
        torch.nn.Linear(5, 5, bias=False),
        torch.nn.Linear(5, 1, bias=False),
    )


def _even_columns(param):
    """FSDP2's shard_placement_fn: matrices whose columns split evenly along them (Shard(1)), the others along rows
    (FSDP2 refuses uneven column shards)."""
    from torch.distributed.tensor import Shard

    return Shard(1) if param.shape[1] % WORLD == 0 else Shard(0)


def _fsdp_muon(rank, mesh):
    """torch.optim.Muon over FSDP2's shards (rows, then columns where they split evenly) against Muon on the unsharded model, from the same
    grads: the momentum equal, the params within bf16 rounding of the update, two all_to_alls per step."""
    from torch.distributed.tensor import distribute_tensor

    exchanges = []
    all_to_all = dist.all_to_all_single

    def counted(*args, **kwargs):
        exchanges.append(1)
        return all_to_all(*args, **kwargs)

    dist.all_to_all_single = counted
    try:
        for placement_fn in (None, _even_columns):
            for options in (dict(lr=0.02), dict(lr=0.01, nesterov=False, adjust_lr_fn="match_rms_adamw")):
                reference = _muon_model()
                opt_ref = torch.optim.Muon(reference.parameters(), **options)
                model = _fsdp_model(mesh, placement_fn, make=_muon_model)
                opt = torch.optim.Muon(model.parameters(), **options)
                compiled = optjit.patch(opt)
                exchanges.clear()
                for t in range(4):
                    for group in (*opt.param_groups, *opt_ref.param_groups):  # a schedule: never compiles again
                        group["lr"] = options["lr"] / (1 + t)
                    for i, (p, q) in enumerate(zip(model.parameters(), reference.parameters())):
                        q.grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(10 * t + i))
                        p.grad = distribute_tensor(q.grad.clone(), mesh, p.placements)
                    opt_ref.step()
                    opt.step()
                    what = f"rank {rank}, Muon {options} over {'columns' if placement_fn else 'rows'}, step {t}"
                    for i, (p, q) in enumerate(zip(model.parameters(), reference.parameters())):
                        buffer = opt.state[p]["momentum_buffer"]
                        assert torch.equal(buffer.full_tensor(), opt_ref.state[q]["momentum_buffer"]), f"{what}: {i}"
                        torch.testing.assert_close(
                            p.detach().full_tensor(), q.detach(), rtol=0, atol=2**-5 * options["lr"] * 4 * (t + 1),
                            msg=lambda m: f"{what}: param {i}: {m}",
                        )  # fmt: skip
                assert len(exchanges) == 2 * 4, exchanges  # one to gather, one to scatter, per step
                metrics = compiled.metrics()
                assert metrics["steps"] == 4 and metrics["compiles"] == 1 and metrics["library_calls"] > 0, metrics
    finally:
        dist.all_to_all_single = all_to_all
    _fsdp_muon_resumes(mesh)


def _fsdp_muon_resumes(mesh):
    """Sharded Muon's state dict (torch's DTensor momentum buffers) loaded into a new optimizer continues the run:
    6 steps equal 3 steps, a state_dict()/load_state_dict() into a fresh model and optimizer, then 3 more. (DCP's
    set_optimizer_state_dict steps torch's own Muon to make state, which fails under FSDP2 in torch 2.15.)"""
    from torch.distributed.tensor import distribute_tensor

    def run(model, opt, steps):
        step = optjit.compile(opt)
        for t in steps:
            for i, p in enumerate(model.parameters()):
                grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * t + i))
                p.grad = distribute_tensor(grad, mesh, p.placements)
            step()

    whole = _fsdp_model(mesh, make=_muon_model)
    run(whole, torch.optim.Muon(whole.parameters(), lr=0.02), range(6))
    first = _fsdp_model(mesh, make=_muon_model)
    opt = torch.optim.Muon(first.parameters(), lr=0.02)
    run(first, opt, range(3))
    resumed = _fsdp_model(mesh, make=_muon_model)
    resumed.load_state_dict(first.state_dict())
    opt_resumed = torch.optim.Muon(resumed.parameters(), lr=0.02)
    opt_resumed.load_state_dict(opt.state_dict())
    run(resumed, opt_resumed, range(3, 6))
    for i, (p, q) in enumerate(zip(whole.parameters(), resumed.parameters())):
        assert torch.equal(p.detach().to_local(), q.detach().to_local()), f"param {i} after resuming"


def _quantized_model():
    """Linear(256, 64)'s weight is quantized (rows of whole blocks; torchao's rule too: each shard is whole blocks),
    Linear(64, 256)'s only where a shard's blocks may span rows (torchao's rule), the biases nowhere (under 4096
    values); rank 1's shard of the last bias is empty."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 64), torch.nn.Tanh(), torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1)
    )


def _state_dtype_model():
    """For state_dtype under FSDP2 (optjit/_quantized_shards.py's rule): Linear(256, 63)'s weight is quantized and
    split unevenly (32 and 31 rows); Linear(63, 4096)'s weight (rows of 63 values) and bias (a vector) keep plain
    state, though an unsharded run quantizes them; Linear(4096, 1)'s weight is quantized, and rank 1's shard of it is
    empty."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 63), torch.nn.Tanh(), torch.nn.Linear(63, 4096), torch.nn.Tanh(), torch.nn.Linear(4096, 1)
    )


def _even_columns_of_matrices(param):
    """FSDP2's shard_placement_fn: matrices whose columns split evenly along them (Shard(1)), other params along dim
    0 (FSDP2 refuses uneven column shards)."""
    from torch.distributed.tensor import Shard

    return Shard(1) if param.dim() == 2 and param.shape[1] % WORLD == 0 else None


# (optimizer, options, state_dtype, FSDP2's shard_placement_fn). Adam's int4 blocks of 128 values split along
# columns: each rank's half of a 256-value row is one block, and of a 4096-value row 16.
QUANTIZED_CONFIGS = [
    (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1), "int8", None),
    (torch.optim.Adam, dict(lr=1e-2, amsgrad=True), "int4", _even_columns_of_matrices),
    (torch.optim.RMSprop, dict(lr=1e-2, momentum=0.5), "fp8", None),
]
QUANTIZED = (0, 4)  # the params _state_dtype_model's FSDP2 run quantizes
PLAIN_THOUGH_WHOLE_QUANTIZES = (2, 3)


def _my_part(whole, shard):
    """The part of `whole` (an unsharded run's state or param) that DTensor `shard` holds on this process: viewed in
    the shard's global shape, split as its placements say."""
    from torch.distributed.tensor import Shard

    part = whole.reshape(shard.shape)
    for mesh_dim, placement in enumerate(shard.placements):
        if isinstance(placement, Shard):
            chunks = part.chunk(shard.device_mesh.size(mesh_dim), dim=placement.dim)
            index = shard.device_mesh.get_local_rank(mesh_dim)
            part = chunks[index] if index < len(chunks) else part.narrow(placement.dim, 0, 0)  # an empty shard
    return part


def _train_beside_whole(model, opt, whole, opt_whole, rank, steps, first=0):
    """Trains FSDP2's `model` and an unsharded copy `whole` on the same grads (the sharded run's, gathered)."""
    for t in range(first, first + steps):
        x = torch.randn(4, 256, generator=torch.Generator().manual_seed(100 * rank + t))
        model(x).square().mean().backward()
        for p, q in zip(model.parameters(), whole.parameters()):  # FSDP2's grads: the mean over the ranks
            q.grad = p.grad.full_tensor()
        opt.step()
        opt.zero_grad()
        opt_whole.step()
        opt_whole.zero_grad()


def _assert_whole_run_sharded(model, opt, whole, opt_whole, what):
    """Each process's params and state (codes and scales too) equal its part of the unsharded run's, bit for bit: a
    shard made of whole blocks of the tensor quantizes them as the whole tensor does."""
    for i, (p, q) in enumerate(zip(model.parameters(), whole.parameters())):
        assert torch.equal(p.detach().to_local(), _my_part(q.detach(), p)), f"{what}: param {i}"
        state, state_whole = opt.state[p], opt_whole.state[q]
        assert list(state) == list(state_whole), f"{what}: param {i} keys {list(state)} vs {list(state_whole)}"
        for key, value in state.items():
            if value.dim() == 0:
                assert torch.equal(value, state_whole[key]), f"{what}: param {i} {key}"
                continue
            expected = _my_part(state_whole[key], value)
            assert value.to_local().dtype == expected.dtype, f"{what}: param {i} {key}: {value.to_local().dtype}"
            local = value.to_local()
            if local.dtype == torch.float8_e4m3fn:
                local, expected = local.view(torch.uint8), expected.view(torch.uint8)
            assert torch.equal(local, expected), f"{what}: param {i} {key}"


def _quantized_pair(mesh, cls, options, state_dtype, placement_fn):
    """FSDP2's _state_dtype_model with one param group in `state_dtype`, and the unsharded copy with the same formats:
    the params FSDP2's run keeps plain though an unsharded run quantizes them in a plain group."""
    model = _fsdp_model(mesh, placement_fn, make=_state_dtype_model)
    opt = cls([{"params": list(model.parameters()), "state_dtype": state_dtype}], **options)
    optjit.patch(opt)
    whole = _state_dtype_model()
    plain = set(PLAIN_THOUGH_WHOLE_QUANTIZES)
    groups = [
        {"params": [q for i, q in enumerate(whole.parameters()) if i not in plain], "state_dtype": state_dtype},
        {"params": [q for i, q in enumerate(whole.parameters()) if i in plain]},
    ]
    opt_whole = cls(groups, **options)
    optjit.patch(opt_whole)
    return model, opt, whole, opt_whole


def _fsdp_state_dtype(rank, mesh):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    for cls, options, state_dtype, placement_fn in QUANTIZED_CONFIGS:
        what = f"rank {rank}, FSDP2 {cls.__name__} state_dtype={state_dtype}"
        model, opt, whole, opt_whole = _quantized_pair(mesh, cls, options, state_dtype, placement_fn)
        _train_beside_whole(model, opt, whole, opt_whole, rank, STEPS)
        params = list(model.parameters())
        for i in QUANTIZED:
            scales = [v.to_local() for k, v in opt.state[params[i]].items() if k.endswith(".scale")]
            assert scales and all(s.dtype == torch.float32 for s in scales), f"{what}: param {i} quantized"
        if placement_fn is None:  # rank 1's empty shard of the (1, 4096) weight is quantized too
            assert (params[4].to_local().numel() == 0) == (rank == 1), what
        for i in PLAIN_THOUGH_WHOLE_QUANTIZES:
            assert not any(k.endswith(".scale") for k in opt.state[params[i]]), f"{what}: param {i} plain"
        _assert_whole_run_sharded(model, opt, whole, opt_whole, what)

    # Rows split into parts that cut their blocks (FSDP2's Shard(1) of 256-value rows into halves of 128, blocks of
    # 256) are refused by name before anything changes.
    model = _fsdp_model(mesh, _even_columns_of_matrices, make=_state_dtype_model)
    opt = torch.optim.AdamW([{"params": list(model.parameters()), "state_dtype": "int8"}], lr=1e-2)
    optjit.patch(opt)
    model(torch.randn(4, 256)).square().mean().backward()
    before = [p.detach().to_local().clone() for p in model.parameters()]
    with pytest.raises(optjit.Error, match=r"into parts of \[128, 128\] values, which cut its blocks of 256"):
        opt.step()
    assert all(torch.equal(p.detach().to_local(), b) for p, b in zip(model.parameters(), before))

    # A checkpoint of the sharded quantized state through torch.distributed.checkpoint, on disk: a new model and
    # optimizer loading it continue the run as the unsharded copy does.
    cls, options, state_dtype, placement_fn = QUANTIZED_CONFIGS[0]
    model, opt, whole, opt_whole = _quantized_pair(mesh, cls, options, state_dtype, placement_fn)
    _train_beside_whole(model, opt, whole, opt_whole, rank, STEPS // 2)
    folder = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(folder)
    dcp.save({"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=folder[0])
    # Loaded at another world size (each process a mesh of its own: every shard whole), the state keeps its format
    # (it depends on the params' shapes alone) and equals the unsharded run's.
    from torch.distributed.device_mesh import init_device_mesh

    def loaded_on(model_mesh):  # a new FSDP2 model and patched optimizer on `model_mesh`, loaded from the checkpoint
        model = _fsdp_model(model_mesh, placement_fn, make=_state_dtype_model)
        opt = cls([{"params": list(model.parameters()), "state_dtype": state_dtype}], **options)
        optjit.patch(opt)
        loaded = {"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt)}
        dcp.load(loaded, checkpoint_id=folder[0])
        model.load_state_dict(loaded["model"])
        set_optimizer_state_dict(model, opt, loaded["optim"])
        return model, opt

    alone = init_device_mesh("cpu", (WORLD, 1), mesh_dim_names=("replicas", "shards"))["shards"]
    resharded, opt_resharded = loaded_on(alone)
    _assert_whole_run_sharded(resharded, opt_resharded, whole, opt_whole, f"rank {rank}, resharded to one process")
    resumed, opt_resumed = loaded_on(mesh)
    _train_beside_whole(resumed, opt_resumed, whole, opt_whole, rank, STEPS // 2, first=STEPS // 2)
    _assert_whole_run_sharded(resumed, opt_resumed, whole, opt_whole, f"rank {rank}, resumed from DCP")
    _fsdp_torchao(rank, mesh)


def _fsdp_torchao(rank, mesh):
    """torchao's low-bit AdamWs under FSDP2: their state is DTensors of torchao's state subclasses, each process's
    shard quantized by torchao's own rule (here every weight's shard is whole blocks of the whole tensor's); optjit
    steps each shard's codes and scales, equal to the unsharded run's. (torchao 0.18's own step is no reference under
    FSDP2 on the CPU: AdamW4bit and AdamWFp8 raise, and AdamW8bit moves even the plain-state biases away from torch's
    AdamW by about 3 lr steps in 3 steps.)"""
    from torchao.optim import AdamW4bit, AdamW8bit, AdamWFp8

    for cls in (AdamW8bit, AdamW4bit, AdamWFp8):
        what = f"rank {rank}, torchao {cls.__name__}"
        model = _fsdp_model(mesh, make=_quantized_model)
        opt = cls(model.parameters(), lr=1e-2)
        optjit.patch(opt)
        whole = _quantized_model()
        opt_whole = cls(whole.parameters(), lr=1e-2)
        optjit.patch(opt_whole)
        _train_beside_whole(model, opt, whole, opt_whole, rank, STEPS)
        quantized = 0
        for i, (p, q) in enumerate(zip(model.parameters(), whole.parameters())):
            assert torch.equal(p.detach().to_local(), _my_part(q.detach(), p)), f"{what}: param {i}"
            for key in ("exp_avg", "exp_avg_sq"):
                state, state_whole = opt.state[p][key].to_local(), opt_whole.state[q][key]
                assert hasattr(state, "codes") == hasattr(state_whole, "codes"), f"{what}: param {i} {key}"
                if hasattr(state, "codes"):
                    codes, codes_whole = state.codes.view(torch.uint8), state_whole.codes.view(torch.uint8)
                    if codes_whole.shape == q.shape:  # 8 bits and FP8 (4-bit codes are flat)
                        assert torch.equal(codes, _my_part(codes_whole, p)), f"{what}: param {i} {key}"
                    quantized += 1
        assert quantized == 4, f"{what}: {quantized} quantized moments"  # both weights' two moments


SCENARIOS = {
    "fsdp_every_optimizer": _fsdp_every_optimizer,
    "fsdp_checkpoint": _fsdp_checkpoint_resumes,
    "fsdp_clipping": _fsdp_clipping,
    "fsdp_step_functions": _fsdp_step_functions,
    "fsdp_fused_inf_check": _fsdp_fused_inf_check,
    "ddp": _ddp,
    "fsdp_muon": _fsdp_muon,
    "fsdp_state_dtype": _fsdp_state_dtype,
}


def _worker(rank, scenario, init_method):
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120)
    )
    try:
        SCENARIOS[scenario](rank, init_device_mesh("cpu", (WORLD,)))
        dist.barrier()
        # DDP's reducer sits in reference cycles; left to the interpreter's exit, it frees gloo's process group
        # after destroy_process_group, which can abort the process ("terminate called without an active exception").
        gc.collect()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="this torch is built without torch.distributed")
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_two_ranks(scenario):
    # Loopback, so that gloo needs no resolvable host name (CI machines may have none); a user's setting wins.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_worker, args=(scenario, "file://" + os.path.join(folder, "rendezvous")), nprocs=WORLD)
