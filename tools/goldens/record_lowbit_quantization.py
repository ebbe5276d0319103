"""Records torchao 0.18's block-wise quantization of optimizer state (torchao/optim/quant_utils.py,
subclass_8bit.py, subclass_4bit.py, subclass_fp8.py) into tests/golden/lowbit/quantization.json: the four dynamic
quantization maps (signed and unsigned, 8 and 4 bits) and, for each format, inputs with their codes and block scales
as torchao computes them. runtime/block_quantization.h must reproduce every bit (tests/runtime/test_block_quantization.cpp).

    PYTHONPATH=<torchao 0.18 source> python tools/goldens/record_lowbit_quantization.py

Every float is written as the hex of its f32 bits, so nothing is lost in JSON."""

import json
import pathlib
import struct

import torch
import torchao
from torchao.optim import subclass_4bit, subclass_8bit, subclass_fp8
from torchao.optim.quant_utils import quantize_4bit_with_qmap, quantize_8bit_with_qmap, scale_tensor

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "golden" / "lowbit" / "quantization.json"


def bits(t):
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in t.float().flatten().tolist()]


def inputs(block, seed):
    """Four blocks: random normals of mixed magnitudes, values on the map's midpoints (ties), a block of zeros, and
    one of tiny values near the scale's floor (1e-12) with an infinity-free spread of exponents."""
    g = torch.Generator().manual_seed(seed)
    normal = torch.randn(block, generator=g) * torch.logspace(-6, 2, block)[torch.randperm(block, generator=g)]
    ties = torch.randn(block, generator=g)
    zeros = torch.zeros(block)
    tiny = torch.randn(block, generator=g) * 1e-13
    return torch.cat([normal, ties, zeros, tiny]).float()


def with_midpoints(x, block, qmap, signed):
    """Block 1 set to exact midpoints of adjacent codes (times the block's absmax, which becomes the scale), where
    torchao's rounding goes up: ties that catch a wrong comparison."""
    mids = ((qmap[:-1] + qmap[1:]) * 0.5)
    if not signed:
        mids = mids[mids >= 0]
    chosen = mids[torch.arange(block - 1) % mids.numel()]
    x[block : 2 * block - 1] = chosen * 3.0
    x[2 * block - 1] = 3.0  # the absmax: scale 3
    return x


def main():
    cases = []
    maps = {
        "signed8": torch.tensor(subclass_8bit.get_qmap_signed(), dtype=torch.float32),
        "unsigned8": torch.tensor(subclass_8bit.get_qmap_unsigned(), dtype=torch.float32),
        "signed4": torch.tensor(subclass_4bit.get_qmap_signed(), dtype=torch.float32),
        "unsigned4": torch.tensor(subclass_4bit.get_qmap_unsigned(), dtype=torch.float32),
    }
    for name, bits_, block in [("signed8", 8, 256), ("unsigned8", 8, 256), ("signed4", 4, 128), ("unsigned4", 4, 128)]:
        qmap = maps[name]
        signed = name.startswith("signed")
        x = inputs(block, len(cases))
        if not signed:
            x = x.abs()
        x = with_midpoints(x, block, qmap, signed)
        scaled, scale = scale_tensor(x.clone(), block)
        quantize = quantize_8bit_with_qmap if bits_ == 8 else quantize_4bit_with_qmap
        codes = quantize(scaled, qmap)
        packed = (codes[::2] << 4) | codes[1::2] if bits_ == 4 else codes
        cases.append({"format": name, "block": block, "input": bits(x), "codes": packed.tolist(), "scale": bits(scale)})
    block = 256
    x = inputs(block, 9)
    codes, scale = subclass_fp8.quantize_fp8(x.clone(), block)
    cases.append({"format": "fp8", "block": block, "input": bits(x), "codes": codes.view(torch.uint8).tolist(),
                  "scale": bits(scale)})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"torchao": torchao.__version__, "torch": torch.__version__,
                               "qmaps": {k: bits(v) for k, v in maps.items()}, "cases": cases}) + "\n")
    print(f"wrote {OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
