"""torch.optim.Muon over FSDP2's DTensor shards: each matrix's Newton-Schulz iterations need the whole matrix, which
no process holds. The step runs in three compiled parts with one collective between each two:

1. on every process's local shards, the momentum (buf.lerp_(g, 1 - momentum)) and the update it orthogonalizes
   (nesterov's g.lerp(buf, momentum), or buf): one kernel per param group;
2. one all_to_all gathers each matrix's update to the process that owns it (owners spread round robin over the
   matrices, in param order), which orthogonalizes its whole matrices as the built-in Muon does (the norm, then the
   iterations in bf16, products in the matrix library; a tall matrix the wide way round, as torch's); one all_to_all
   scatters each orthogonalized matrix's rows (or columns) back to the processes that hold them;
3. on the local shards, the decoupled weight decay and the update scaled by the learning rate adjusted to the whole
   matrix's shape (torch's adjust_lr_fn): one kernel per param group.

Each part is an optjit step function (optjit._step_function), so hyperparameters are arguments and never recompile.
The result is Muon's on the unsharded model: the momentum is pointwise, and each matrix is orthogonalized whole, by
the same products."""

import math

import torch
import torch.distributed as dist
from torch.optim._muon import _adjust_lr  # torch >= 2.9, as Muon itself

from ._optjit import Error
from ._shards import _chunk_sizes, _local, _sharded
from ._step_function import step_function


def _momentum_update(params, grads, bufs, updates, *, momentum, nesterov):
    """torch's Muon momentum, on local shards: the buffer, and the update the iterations orthogonalize."""
    for g, buf, u in zip(grads, bufs, updates):
        buf.lerp_(g, 1 - momentum)
        u.copy_(g.lerp(buf, momentum) if nesterov else buf)


def _decayed_update(params, grads, updates, ratios, *, lr, weight_decay):
    """param.mul_(1 - lr * weight_decay); param.add_(update, alpha=-adjusted_lr), the ratio per matrix its shape's."""
    for p, x, ratio in zip(params, updates, ratios):
        p.mul_(1 - lr * weight_decay)
        p.add_(x, alpha=-(lr * ratio))


def _orthogonalizer(ns_steps, tall, f32):
    """A step function writing the orthogonalized update of each whole matrix (the list `updates`) into `outputs`:
    torch's _zeropower_via_newtonschulz, a tall matrix iterated the wide way round (A = X^T X, X = a X + X B^T), in
    bf16 (or in f32 with optjit's f32_iterations)."""

    def orthogonalize(outputs, updates, *, a, b, c, eps):
        for out, u in zip(outputs, updates):
            x = u if f32 else u.bfloat16()
            x = x / x.norm().clamp(min=eps)
            for _ in range(ns_steps):
                if tall:
                    gram = x.T @ x
                    x = torch.addmm(x, x, torch.addmm(gram, gram, gram, beta=b, alpha=c).T, beta=a)
                else:
                    gram = x @ x.T
                    x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
            out.copy_(x)

    return step_function(orthogonalize, name=f"muon_orthogonalize_{'tall' if tall else 'wide'}")


class ShardedMuon:
    """The step of torch.optim.Muon `opt` over FSDP2's shards (see the module's docstring)."""

    def __init__(self, opt):
        params = [p for group in opt.param_groups for p in group["params"]]
        sharded = _sharded(params)
        if len(sharded) != len(params):
            raise Error(
                "torch.optim.Muon over params some of which are DTensor shards and some not: optjit gathers each "
                "sharded matrix to its owner over one mesh; shard every param alike (FSDP2's fully_shard)"
            )
        mesh = params[0].device_mesh
        for p in params:
            shard_dims = [s.dim for s in p.placements if hasattr(s, "dim")]
            if p.device_mesh != mesh or len(p.placements) != 1 or len(shard_dims) != 1 or shard_dims[0] not in (0, 1):
                raise Error(
                    f"torch.optim.Muon over a DTensor with placements {p.placements} on {p.device_mesh}: optjit "
                    "gathers matrices split along one dimension (Shard(0) or Shard(1)) of one 1-D mesh, as FSDP2 "
                    "shards them"
                )
        self._group = mesh.get_group()
        self._world = dist.get_world_size(self._group)
        self._rank = dist.get_rank(self._group)
        self._momentum = step_function(_momentum_update, name="muon_momentum")
        self._apply = step_function(_decayed_update, name="muon_update")
        self._orthogonalizers = {}  # (ns_steps, tall, f32) -> step function
        self._ratios = {}  # (param, adjust_lr_fn) -> its 0-d ratio tensor
        # The tensors the parts hand each other, kept from step to step: a step function's state lists are bound
        # once (new tensors every step would build it again).
        self._buffers = {}
        self.steps = 0
        self.compiles = 0  # steps in which a part compiled (the first, and those after a change of structure)
        self._reasons = []

    def step(self, opt):
        """One step of every param with a grad: torch's state made as torch makes it, then the three parts."""
        entries = []  # (group, param, local grad, local momentum buffer)
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = opt.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                entries.append((group, p, _local(p.grad), _local(state["momentum_buffer"])))
        if not entries:
            return
        compiled_before = self._parts_compiled()
        if len({g.dtype for _, _, g, _ in entries}) > 1:
            raise Error(
                "torch.optim.Muon over DTensor shards of several dtypes: optjit gathers every matrix's update in one "
                "collective, of one dtype; give the params one dtype"
            )
        updates = [self._buffer(("update", id(p)), g.shape, g) for _, p, g, _ in entries]
        for group, members in self._by_group(entries):
            members = [k for k in members if entries[k][2].numel() > 0]  # a process's shard may be empty
            if members:
                self._momentum(
                    [_local(entries[k][1]) for k in members], [entries[k][2] for k in members],
                    [entries[k][3] for k in members], [updates[k] for k in members],
                    momentum=group["momentum"], nesterov=bool(group["nesterov"])
                )  # fmt: skip
        owned = self._gather(entries, updates)  # {entry: the whole matrix's update}
        orthogonalized = {k: self._buffer(("orthogonalized", id(entries[k][1])), u.shape, u) for k, u in owned.items()}
        for group, members in self._by_group(entries):
            mine = [k for k in members if k in owned]
            for tall in (False, True):
                matrices = [k for k in mine if (owned[k].size(0) > owned[k].size(1)) == tall]
                if not matrices:
                    continue
                a, b, c = group["ns_coefficients"]
                key = (int(group["ns_steps"]), tall, bool(group.get("f32_iterations", False)))
                if key not in self._orthogonalizers:
                    self._orthogonalizers[key] = _orthogonalizer(*key)
                self._orthogonalizers[key](
                    [orthogonalized[k] for k in matrices], [owned[k] for k in matrices],
                    a=a, b=b, c=c, eps=group["eps"]
                )  # fmt: skip
        local_updates = self._scatter(entries, orthogonalized)
        for group, members in self._by_group(entries):
            members = [k for k in members if entries[k][2].numel() > 0]
            if not members:
                continue
            ratios = [self._ratio(entries[k][1], group["adjust_lr_fn"]) for k in members]
            lr = group["lr"].item() if isinstance(group["lr"], torch.Tensor) else group["lr"]
            self._apply(
                [_local(entries[k][1]) for k in members], [entries[k][2] for k in members],
                [local_updates[k] for k in members], ratios, lr=lr, weight_decay=group["weight_decay"]
            )  # fmt: skip
        self.steps += 1
        if self._parts_compiled() != compiled_before:
            self.compiles += 1
            if self.compiles > 1:
                self._reasons.append(
                    "a part of the step compiled again: its structure changed (ns_steps, nesterov, f32_iterations, "
                    "tall or wide matrices owned, new params or shapes)"
                )

    def _parts(self):
        return [self._momentum, self._apply, *self._orthogonalizers.values()]

    def _parts_compiled(self):
        return sum(f.metrics()["compiles"] for f in self._parts())

    def _buffer(self, key, shape, like):
        """The kept tensor `key` of `shape` and `like`'s dtype and device, made again only when those change."""
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != shape or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = self._buffers[key] = like.new_empty(shape)
        return buffer

    @staticmethod
    def _by_group(entries):
        groups = {}
        for k, (group, *_) in enumerate(entries):
            groups.setdefault(id(group), (group, []))[1].append(k)
        return list(groups.values())

    def _ratio(self, param, adjust_lr_fn):
        key = (id(param), adjust_lr_fn)
        if key not in self._ratios:
            # torch's own adjustment of a unit lr, for the whole matrix's shape (it is linear in lr)
            ratio = _adjust_lr(1.0, adjust_lr_fn, param.shape)
            self._ratios[key] = torch.tensor(ratio, dtype=_local(param).dtype)
        return self._ratios[key]

    def _owner(self, k):
        return k % self._world

    def _chunks(self, param):
        """Each process's shard shape of `param`, in rank order."""
        dim = next(s.dim for s in param.placements if hasattr(s, "dim"))
        shapes = []
        for size in _chunk_sizes(param.shape[dim], self._world):
            shape = list(param.shape)
            shape[dim] = size
            shapes.append(tuple(shape))
        return dim, shapes

    def _gather(self, entries, updates):
        """One all_to_all: every process sends each matrix's local update to its owner, which assembles them."""
        send = [[] for _ in range(self._world)]
        for k, u in enumerate(updates):
            send[self._owner(k)].append(u.reshape(-1))
        mine = [k for k in range(len(entries)) if self._owner(k) == self._rank]
        received = self._exchange(send, [[math.prod(self._chunks(entries[k][1])[1][r]) for k in mine]
                                         for r in range(self._world)], updates[0])  # fmt: skip
        owned = {}
        for i, k in enumerate(mine):
            dim, shapes = self._chunks(entries[k][1])
            owned[k] = self._buffer(("whole", id(entries[k][1])), entries[k][1].shape, updates[0])
            torch.cat([received[r][i].view(shapes[r]) for r in range(self._world)], dim=dim, out=owned[k])
        return owned

    def _scatter(self, entries, orthogonalized):
        """One all_to_all: each owner sends every process its shard of each orthogonalized matrix."""
        send = [[] for _ in range(self._world)]
        for k, x in orthogonalized.items():
            dim, shapes = self._chunks(entries[k][1])
            offset = 0
            for r in range(self._world):
                send[r].append(x.narrow(dim, offset, shapes[r][dim]).reshape(-1))
                offset += shapes[r][dim]
        local_shapes = [self._chunks(entries[k][1])[1][self._rank] for k in range(len(entries))]
        expected = [[math.prod(local_shapes[k]) for k in range(len(entries)) if self._owner(k) == r]
                    for r in range(self._world)]  # fmt: skip
        received = self._exchange(send, expected, entries[0][2])
        local = {}
        taken = [0] * self._world
        for k in range(len(entries)):
            r = self._owner(k)
            local[k] = self._buffer(("local", id(entries[k][1])), local_shapes[k], entries[k][2])
            local[k].copy_(received[r][taken[r]].view(local_shapes[k]))
            taken[r] += 1
        return local

    def _exchange(self, send, expected, like):
        """all_to_all_single of the flat pieces `send[r]` (to process r), receiving `expected[r]` element counts
        from each process r: the received pieces, per process."""
        inputs = [torch.cat(pieces) if pieces else like.new_empty(0) for pieces in send]
        output = like.new_empty(sum(sum(counts) for counts in expected))
        dist.all_to_all_single(
            output, torch.cat(inputs).contiguous(), [sum(c) for c in expected], [x.numel() for x in inputs],
            group=self._group
        )  # fmt: skip
        pieces, offset = [], 0
        for counts in expected:
            mine = []
            for n in counts:
                mine.append(output.narrow(0, offset, n))
                offset += n
            pieces.append(mine)
        return pieces

    def metrics(self):
        """CompiledStep.metrics() of the step: compiles counts the steps in which a part compiled (so the first step,
        then a change of structure such as ns_steps, never a new lr), kernels and library calls the parts' last."""
        functions = self._parts()
        counts = [f.metrics() for f in functions]
        return {
            "steps": self.steps,
            "skipped_steps": 0,
            "compiles": self.compiles,
            "recompiles": max(0, self.compiles - 1),
            "rebinds": 0,
            "kernels_generated": 0,
            "cache_hits": sum(m["cache_hits"] for m in counts),
            "compile_ms": sum(m["compile_ms"] for m in counts),
            "dispatch_ms": 0.0,
            "recompile_reasons": list(self._reasons),
            "kernels": sum(f.kernel_count or 0 for f in functions),
            "library_calls": sum(f.library_call_count or 0 for f in functions),
        }
