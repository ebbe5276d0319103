"""Block-quantized state (the group option state_dtype) over FSDP2's shards: each process quantizes its own shard by
its own blocks, and the codes and scales are DTensors laid out as the param is, so that torch.distributed.checkpoint
saves and loads them like any other sharded state, at another world size too.

The layout: a param of shape (..., n) keeps its scales as a tensor of shape (..., n / block), one per block of each
last-dimension row, and its codes in the param's shape (8 bits, FP8) or (..., n / 2) (4 bits, two per byte). Each is
split over the mesh with the param's own placements, so a process's shard of rows holds exactly its rows' blocks.

Whether a param's state is quantized depends on its whole shape alone, never on the mesh, so that every process
holds the same format and a checkpoint loads into a run of another world size with the format it was saved in:
quantized when the param has at least MIN_QUANTIZED_VALUES values (torchao's size rule) in rows of whole blocks (n a
multiple of the block), and at least two dimensions; plain otherwise, as torchao keeps small tensors. (torchao
decides by each process's shard, so a param split unevenly can be quantized on one process and not on another.)
Vectors keep plain state here even where an unsharded run quantizes them: their blocks would be cut by the split. A
param split along its last dimension (FSDP2's shard_placement_fn) into parts that are not whole blocks is refused
by name, as is one split over two mesh dimensions."""

import math

from ._optjit import MIN_QUANTIZED_VALUES, Error
from ._shards import _chunk_sizes


def is_dtensor(tensor):
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without torch.distributed
        return False
    return isinstance(tensor, DTensor)


def _split(param):
    """(dim, parts): the param's dimension split over the mesh and the number of parts; (None, 1) for a replicated
    param; None when it is split over two mesh dimensions."""
    from torch.distributed.tensor import Shard

    sharded = [(d, p.dim) for d, p in enumerate(param.placements) if isinstance(p, Shard)]
    if not sharded:
        return None, 1
    if len(sharded) > 1:
        return None
    mesh_dim, dim = sharded[0]
    return dim % param.dim(), param.device_mesh.size(mesh_dim)


def _splits_alike(size, parts, per):
    """Whether DTensor's even split of a dimension of `size // per` entries (one per `per` values) gives each part
    its share of the split of `size` values: every part a whole number of entries, at the same boundaries."""
    chunks = _chunk_sizes(size, parts)
    return size % per == 0 and _chunk_sizes(size // per, parts) == [c // per if c % per == 0 else -1 for c in chunks]


def shards_quantize(param, block):
    """Whether state kept in blocks of `block` values is quantized for DTensor `param` (see the module's docstring)."""
    if param.dim() < 2 or param.numel() < MIN_QUANTIZED_VALUES or param.shape[-1] % block != 0:
        return False
    split = _split(param)
    where = f"state_dtype over a param of shape {list(param.shape)} with placements {param.placements}"
    if split is None:
        raise Error(f"{where}: it is split over two mesh dimensions, and optjit lays quantized state out for one")
    dim, parts = split
    if dim == param.dim() - 1 and not (
        _splits_alike(param.shape[-1], parts, block) and (block % 2 == 1 or _splits_alike(param.shape[-1], parts, 2))
    ):
        raise Error(
            f"{where}: its rows are split over {parts} processes into parts of "
            f"{_chunk_sizes(param.shape[-1], parts)} values, which cut its blocks of {block}; split it along another "
            "dimension (FSDP2's default, Shard(0)), or choose a state_block_size that divides every part"
        )
    return True


def _dtensor(local, param, local_last, last):
    """`local` viewed as the param's shard of a tensor whose last dimension is `last` (`local_last` in this
    process), as a DTensor split as `param` is."""
    from torch.distributed.tensor import DTensor

    local = local.view(list(param.to_local().shape[:-1]) + [local_last])
    shape = list(param.shape[:-1]) + [last]
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=tuple(shape), stride=tuple(strides)
    )


def as_dtensors(param, key, codes, scales, block, bits):
    """A process's quantized state entry for DTensor `param` (its shard's codes, `bits` each, and scales, made flat or
    in the shard's shape) as DTensors in the module docstring's layout: the codes under `key`, the scales under
    "<key>.scale"."""
    per_byte = 8 // bits
    local_last = param.to_local().shape[-1]
    return {
        key: _dtensor(codes, param, local_last // per_byte, param.shape[-1] // per_byte),
        key + ".scale": _dtensor(scales, param, local_last // block, param.shape[-1] // block),
    }
