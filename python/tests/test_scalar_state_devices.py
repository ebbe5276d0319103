"""Devices, without a GPU: where torch puts each optimizer's scalar state (step, mu_product, eta, mu), which optjit's
state follows, checked against torch's own step on the meta device (scalar state that torch keeps on the CPU beside a
CUDA param is updated on the host, in place, as torch does); and the stream lending is a no-op for CPU tensors. The
same on a GPU: test_cuda.py."""

import contextlib
import sys

import pytest
import torch

import optjit
from optjit import _torch_optim
from optjit._compiled import _cuda_streams
from conftest import EVERY_OPTIMIZER

FUSED = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad)


@contextlib.contextmanager
def meta_counts_as_a_gpu():
    """torch checks capturable and fused steps against its device lists; the meta device stands in for a GPU."""
    import torch.optim.optimizer as base
    import torch.utils._foreach_utils as foreach_utils

    capturable, fused = base._get_capturable_supported_devices, foreach_utils._get_fused_kernels_supported_devices
    patched = {}
    modules = [m for name, m in sys.modules.items() if name.startswith("torch.optim.")] + [foreach_utils]
    for module in modules:
        for name, original, devices in (
            ("_get_capturable_supported_devices", capturable, lambda *a, **k: ["meta", *capturable(*a, **k)]),
            ("_get_fused_kernels_supported_devices", fused, lambda *a, **k: ["meta", *fused(*a, **k)]),
        ):
            if getattr(module, name, None) is original:
                patched[(module, name)] = original
                setattr(module, name, devices)
    try:
        yield
    finally:
        for (module, name), original in patched.items():
            setattr(module, name, original)


def torch_scalar_state_devices(cls, kwargs):
    """The device of each 0-d state entry torch's own step makes for a param on the meta device."""
    param = torch.nn.Parameter(torch.zeros(3, device="meta"))
    param.grad = torch.zeros(3, device="meta")
    opt = cls([param], **kwargs)
    with meta_counts_as_a_gpu():
        try:
            opt.step()
        except (RuntimeError, NotImplementedError):
            pass  # a meta tensor has no value to read (.item()); the state was made before
    return opt, param, {k: v.device.type for k, v in opt.state[param].items() if v.dim() == 0}


def placements():
    for cls, kwargs in EVERY_OPTIMIZER + [(torch.optim.Adafactor, dict(lr=0.01))]:
        if cls is torch.optim.SGD:
            continue  # no scalar state
        yield pytest.param(cls, dict(kwargs), id=f"{cls.__name__}-default")
        if "capturable" in cls.__init__.__code__.co_varnames:
            yield pytest.param(cls, dict(kwargs, capturable=True), id=f"{cls.__name__}-capturable")
        if cls in FUSED:
            yield pytest.param(cls, dict(kwargs, fused=True), id=f"{cls.__name__}-fused")


@pytest.mark.parametrize("cls,kwargs", list(placements()))
def test_scalar_state_goes_where_torch_puts_it(cls, kwargs):
    opt, param, torch_devices = torch_scalar_state_devices(cls, kwargs)
    device = _torch_optim.scalar_state_device(cls, opt.param_groups[0], param).type
    assert torch_devices, f"{cls.__name__} made no scalar state"
    assert set(torch_devices.values()) == {device}, f"torch: {torch_devices}, optjit: {device}"


def test_lending_streams_is_nothing_for_cpu_tensors():
    streams = _cuda_streams([torch.zeros(3), torch.zeros(())])
    assert streams._devices == []
    lent = streams.lend()
    assert isinstance(lent, contextlib.nullcontext), f"CPU tensors lent {lent!r}"
    with lent:
        pass
    empty = optjit._optjit.CudaStreams([])
    with empty:  # nothing lent: entering and leaving touch no CUDA driver, which this machine may lack
        pass
