"""Records tests/golden/lowbit/torchao_adam.json: torchao 0.18's low-bit Adam/AdamW (its own compiled CPU step) over
three steps, for optjit's C++ optimizers of the same names to match bit for bit. Params and grads are formulas both
sides evaluate alike (libm's sin and cos in double, rounded to the param's dtype); after each step the file holds, per
param, an FNV-1a hash of the param's bytes and of each state tensor's (codes, scales, or plain state), and their first
values for a reader.
    PYTHONPATH=<torchao 0.18.0 source> python tools/goldens/record_torchao_adam.py tests/golden/lowbit/torchao_adam.json
"""
import json
import math
import sys

import torch

torch.set_num_threads(1)
import torchao  # noqa: E402
import torchao.optim as O  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
GRAD_SCALES = [0.1, 1.0, 10.0]

CONFIGS = [
    {"name": "AdamW8bit", "dtype": "f32", "groups": [{"shapes": [[4096], [1000]]}], "options": {}},
    {"name": "AdamW8bit", "dtype": "bf16", "groups": [{"shapes": [[64, 64], [1000]]}], "options": {}},
    {"name": "AdamW8bit", "dtype": "f32", "groups": [{"shapes": [[8192]]}],
     "options": {"lr": 1e-2, "betas": [0.3, 0.6], "eps": 1e-6}},
    {"name": "AdamW8bit", "dtype": "f32", "groups": [{"shapes": [[8, 1024]]}], "options": {"block_size": 512}},
    {"name": "AdamW8bit", "dtype": "f32",
     "groups": [{"shapes": [[4096]]}, {"shapes": [[2, 2048], [300]], "lr": 1e-2, "weight_decay": 0.1}],
     "options": {}},
    {"name": "Adam8bit", "dtype": "f32", "groups": [{"shapes": [[4096]]}], "options": {"weight_decay": 0.01}},
    {"name": "AdamW4bit", "dtype": "f32", "groups": [{"shapes": [[32, 128], [1000]]}], "options": {}},
    {"name": "AdamW4bit", "dtype": "bf16", "groups": [{"shapes": [[32, 128], [4160]]}], "options": {}},
    {"name": "Adam4bit", "dtype": "f32", "groups": [{"shapes": [[4096]]}], "options": {"weight_decay": 0.01}},
    {"name": "AdamWFp8", "dtype": "f32", "groups": [{"shapes": [[4096], [1000]]}], "options": {}},
    {"name": "AdamWFp8", "dtype": "bf16", "groups": [{"shapes": [[16, 256]]}], "options": {}},
    {"name": "AdamFp8", "dtype": "f32", "groups": [{"shapes": [[4096]]}], "options": {"weight_decay": 0.01}},
]


def values(n, phase, dtype):
    return torch.tensor([math.cos(0.11 * i + phase) for i in range(n)], dtype=torch.float64).to(dtype)


def grad_values(n, phase, step, dtype):
    scale = GRAD_SCALES[step]
    return torch.tensor([math.sin(0.37 * i + 1.3 * step + phase) * scale for i in range(n)],
                        dtype=torch.float64).to(dtype)


def fnv1a(t):
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).tolist()
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def first(t):
    flat = t.detach().contiguous().flatten()[:4]
    if flat.dtype == torch.float8_e4m3fn or flat.dtype == torch.uint8:
        return flat.view(torch.uint8).tolist()
    return flat.float().tolist()


def state_tensors(state):
    out = {}
    for key, v in state.items():
        if key == "step":
            out["step"] = v
        elif hasattr(v, "codes"):
            out[key] = v.codes
            out[key + ".scale"] = v.scale
        else:
            out[key] = v
    return out


def record(config):
    dtype = DTYPES[config["dtype"]]
    groups, params, phase = [], [], 0
    for g in config["groups"]:
        ps = []
        for shape in g["shapes"]:
            n = math.prod(shape)
            p = torch.nn.Parameter(values(n, phase, dtype).reshape(shape))
            ps.append((p, phase))
            phase += 1
        params += ps
        group = {"params": [p for p, _ in ps]}
        group.update({k: v for k, v in g.items() if k != "shapes"})
        groups.append(group)
    options = dict(config["options"])
    if "betas" in options:
        options["betas"] = tuple(options["betas"])
    opt = getattr(O, config["name"])(groups, **options)
    steps = []
    for step in range(3):
        for p, ph in params:
            p.grad = grad_values(p.numel(), ph, step, dtype).reshape(p.shape)
        opt.step()
        after = []
        for p, _ in params:
            entry = {"param": {"hash": fnv1a(p), "first": first(p)}}
            for key, t in state_tensors(opt.state[p]).items():
                entry[key] = {"hash": fnv1a(t), "first": first(t), "dtype": str(t.dtype).replace("torch.", ""),
                              "shape": list(t.shape)}
            after.append(entry)
        steps.append(after)
    return dict(config, steps=steps)


def main():
    out = {"torchao": torchao.__version__, "torch": torch.__version__.split("+")[0],
           "grad_scales": GRAD_SCALES, "cases": [record(c) for c in CONFIGS]}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
