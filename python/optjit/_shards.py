"""Reductions over FSDP2's shards: a step over params that are DTensor shards steps each process's local tensors,
and its norms, sums and maxima are the whole tensors' (all-reduced over the mesh dimensions the params are split
along, as torch reduces the Partial DTensors of an eager step)."""

import torch

from ._optjit import Error


def _local(tensor):
    """The tensor whose memory holds `tensor`'s elements in this process: a DTensor's local tensor (a DTensor's own
    data_ptr() is 0 and its shape the global one), or the tensor itself."""
    return getattr(tensor, "_local_tensor", tensor)


def _chunk_sizes(size, world):
    """The sizes of torch.chunk(size, world) padded with empty chunks: how DTensor's Shard splits a dimension."""
    sizes = [len(c) for c in torch.arange(size).chunk(world)]
    return sizes + [0] * (world - len(sizes))


def _sharded(params):
    """The params that are shards of DTensors (FSDP2's), which optjit steps through their local tensors."""
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:  # a torch built without torch.distributed
        return []
    return [p for p in params if isinstance(p, DTensor) and any(isinstance(s, Shard) for s in p.placements)]


def _all_reduce_over_shards(params, what, refuse_now=False):
    """`reduce(values, op)`: an all-reduce of a list of numbers over the mesh dimensions the params are sharded along
    (as torch reduces a Partial DTensor), returning the reduced list, or None when no param is a shard (DDP's replicas
    hold whole grads). Params split along other mesh dimensions, or not at all, beside sharded ones are refused by the
    first reduction (a step that reduces before it changes anything), or now with `refuse_now`."""
    sharded = _sharded(params)
    if not sharded:
        return None
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate

    def sharded_dims(p):  # the mesh dimensions p is split along (Shard(0) or Shard(1) alike)
        return [d for d, placement in enumerate(p.placements) if not isinstance(placement, Replicate)]

    mesh, dims = sharded[0].device_mesh, sharded_dims(sharded[0])
    if len(sharded) != len(params) or any(p.device_mesh != mesh or sharded_dims(p) != dims for p in sharded):

        def refuse(values=None, op=None):
            raise Error(
                f"{what} over params that are not all split along the same dimensions of one device mesh (a "
                "replicated param among sharded ones, or two meshes): optjit all-reduces over one mesh"
            )

        if refuse_now:
            refuse()
        return refuse
    device = sharded[0].to_local().device

    def reduce(values, op):
        value = torch.tensor(values, dtype=torch.float64, device=device)
        for d in dims:
            dist.all_reduce(value, op=op, group=mesh.get_group(d))
        return value.tolist()

    return reduce


def _grad_norm_reducer(params):
    """For clipping over sharded params: each process's partial norm (a sum of squares, or the largest |element|)
    made the whole tensors', as clip_grad_norm_ on DTensors reduces."""
    reduce = _all_reduce_over_shards(params, "max_grad_norm")
    if reduce is None:
        return None
    import torch.distributed as dist

    return lambda partial, l2: reduce([partial], dist.ReduceOp.SUM if l2 else dist.ReduceOp.MAX)[0]


def _inf_check_reducer(params):
    """For the in-step inf check over sharded params: whether any process found an inf or NaN, as torch's DTensor
    check all-reduces found_inf with max, so that every process skips the same steps."""
    reduce = _all_reduce_over_shards(params, "the in-step inf check")
    if reduce is None:
        return None
    import torch.distributed as dist

    return lambda found: reduce([1.0 if found else 0.0], dist.ReduceOp.MAX)[0] != 0


def _shard_reducer(params, what, reduces):
    """For a step over FSDP2's shards: `reduce(values, "sum" | "max")`, each process's per-tensor partials of the step's
    norms, sums and maxima combined over the mesh, as torch reduces the Partial DTensors they make; None for tensors
    that are not shards. A step that `reduces` over params the mesh does not split alike is refused now: its first
    kernel may have written state before it reduces."""
    reduce = _all_reduce_over_shards(params, what, refuse_now=reduces)
    if reduce is None:
        return None
    import torch.distributed as dist

    return lambda values, how: reduce(values, dist.ReduceOp.SUM if how == "sum" else dist.ReduceOp.MAX)


def _check_sharded_reductions(cls, params):
    """Adafactor reduces over rows, columns and whole tensors, which span the shards of a sharded param: optjit would
    reduce each process's shard alone, so it refuses rather than step differently from torch."""
    if cls is torch.optim.Adafactor and _sharded(params):
        raise Error(
            "torch.optim.Adafactor over DTensor shards (FSDP2): its row, column and RMS reductions span the shards, "
            "and optjit reduces each process's local shard alone; step it with torch, or unshard the params"
        )
