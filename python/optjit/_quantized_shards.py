"""Block-quantized state (the group option state_dtype) over FSDP2's shards: each process quantizes its own shard by
its own blocks, and the codes and scales are DTensors laid out as the param is, so that torch.distributed.checkpoint
saves and loads them like any other sharded state.

The layout: a param of shape (..., n) keeps its scales as a tensor of shape (..., n / block), one per block of each
last-dimension row, and its codes in the param's shape (8 bits, FP8) or (..., n / 2) (4 bits, two per byte). Each is
split over the mesh with the param's own placements. That holds only when every process's shard is whole blocks of
rows and DTensor's even split (torch.chunk) of the scales' and codes' dimension gives each process exactly its
shard's: n a multiple of the block, and, for a param split along its last dimension, every process's part of it too.

Whether a param's state is quantized is decided for the whole tensor, so that every process holds the same format
(torchao decides by each process's shard, so that a param split unevenly can be quantized on one process and not on
another): quantized when the whole tensor has at least MIN_QUANTIZED_VALUES values (torchao's size rule), every
process's shard holds some, and the layout above holds; plain state otherwise, as torchao keeps small tensors."""

import math

from ._optjit import MIN_QUANTIZED_VALUES
from ._shards import _chunk_sizes


def is_dtensor(tensor):
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without torch.distributed
        return False
    return isinstance(tensor, DTensor)


def _splits(param):
    """(dim, parts): the param's dimension split over the mesh and the number of parts; (None, 1) for a replicated
    param; None when it is split over several mesh dimensions (two Shard placements), which this layout leaves plain."""
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
    split = _splits(param)
    if split is None or param.dim() == 0 or param.numel() < MIN_QUANTIZED_VALUES:
        return False
    dim, parts = split
    if dim is None:
        return param.shape[-1] % block == 0
    if 0 in _chunk_sizes(param.shape[dim], parts):
        return False
    if dim != param.dim() - 1:
        return param.shape[-1] % block == 0
    return _splits_alike(param.shape[-1], parts, block) and (block % 2 == 1 or _splits_alike(param.shape[-1], parts, 2))


def _dtensor(local, param, last):
    """`local` viewed as the param's shard of a tensor whose last dimension is `last`, as a DTensor split as `param` is."""
    from torch.distributed.tensor import DTensor

    local_shape = list(param.to_local().shape)
    local = local.view(local_shape[:-1] + [local.numel() // math.prod(local_shape[:-1])])
    shape = list(param.shape[:-1]) + [last]
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=tuple(shape), stride=tuple(strides)
    )


def as_dtensors(param, key, codes, scales, block):
    """A process's quantized state entry for DTensor `param` (its shard's codes and scales, made flat or in the shard's
    shape) as DTensors in the module docstring's layout: the codes under `key`, the scales under "<key>.scale"."""
    last = param.shape[-1]
    codes_last = last if codes.numel() == param.to_local().numel() else last // 2
    return {key: _dtensor(codes, param, codes_last), key + ".scale": _dtensor(scales, param, last // block)}
