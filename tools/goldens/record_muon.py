"""Records the Muon golden trajectories (tests/golden/muon/*.json) from torch.optim.Muon (torch 2.15, CPU).

The format is golden/FORMAT_NEXT.md's (7 steps; grads, lr, expect_params, expect_state per step), with
"optimizer": "Muon". Muon's Newton-Schulz iterations run in bf16, so two correct implementations differ by the
spread of bf16 rounding in the products' summation order: each case's atol is measured, not guessed. It is 2x the
largest difference over the case between torch's step and the same step with its iterations in f32 (a bound on
what bf16 rounding moves), and at least 1e-6. Momentum buffers do not depend on the iterations: they are checked
with the main format's tolerances for the dtype (state_rtol, state_atol).

Run: python tools/goldens/record_muon.py tests/golden/muon   (with the test venv's python)
"""
import json
import math
import sys
from pathlib import Path

import torch
from torch.optim import _muon

SCALES = [1.0, 0.5, 2.0, 0.1, 1.0, 0.05, 1.5]

CASES = [
    # name, options, shapes, groups (None or [(indices, overrides)]), dtype, null grads [(step, param)]
    ("muon_defaults", {"lr": 0.02}, [[6, 4], [4, 6], [5, 5], [1, 7]], None, torch.float32, [(2, 1)]),
    ("muon_no_nesterov", {"lr": 0.02, "nesterov": False}, [[8, 3], [3, 8]], None, torch.float32, []),
    ("muon_match_rms_adamw", {"lr": 0.01, "adjust_lr_fn": "match_rms_adamw", "weight_decay": 0.05},
     [[12, 5], [5, 12], [7, 1]], None, torch.float32, [(0, 2), (4, 0)]),
    ("muon_spectral_unclamped", {"lr": 0.01, "adjust_lr_fn": "spectral_unclamped"}, [[10, 4], [4, 10], [1, 9]],
     None, torch.float32, []),
    ("muon_original_options", {"lr": 0.03, "adjust_lr_fn": "original", "momentum": 0.9, "weight_decay": 0.0,
                               "ns_coefficients": [3.0, -3.2, 1.2], "ns_steps": 3, "eps": 1e-5},
     [[9, 6], [6, 9]], None, torch.float32, []),
    ("muon_zero_steps_no_momentum", {"lr": 0.05, "momentum": 0.0, "ns_steps": 0}, [[4, 3], [3, 4]], None,
     torch.float32, []),
    ("muon_groups", {"lr": 0.02}, [[6, 4], [4, 6], [5, 5], [2, 9]],
     [([0, 3], {}), ([1, 2], {"lr": 0.005, "weight_decay": 0.3, "momentum": 0.8, "nesterov": False,
                              "adjust_lr_fn": "match_rms_adamw", "ns_steps": 4})], torch.float32, [(2, 1)]),
    ("muon_larger", {"lr": 0.02}, [[48, 32], [32, 64]], None, torch.float32, []),
    ("muon_f64", {"lr": 0.02}, [[6, 4], [4, 6]], None, torch.float64, []),
]


def zeropower_f32(grad, ns_coefficients, ns_steps, eps):
    """torch's _zeropower_via_newtonschulz with its iterations in f32: the reference for the bf16 spread."""
    a, b, c = ns_coefficients
    ortho = grad.to(torch.float32, copy=True)
    if grad.size(0) > grad.size(1):
        ortho = ortho.T
    ortho.div_(ortho.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram = ortho @ ortho.T
        ortho = torch.addmm(ortho, torch.addmm(gram, gram, gram, beta=b, alpha=c), ortho, beta=a)
    if grad.size(0) > grad.size(1):
        ortho = ortho.T
    return ortho.to(grad.dtype)


def run(options, shapes, groups, dtype, nulls, seed, iterations_in_f32=False):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes]
    initial = [p.clone() for p in params]
    grads = [[None if (t, i) in nulls else (torch.randn(s, generator=gen, dtype=torch.float64) * SCALES[t]).to(dtype)
              for i, s in enumerate(shapes)] for t in range(7)]
    if groups:
        spec = [{"params": [params[i] for i in idx], **over} for idx, over in groups]
    else:
        spec = params
    opt = torch.optim.Muon(spec, **options)
    original = _muon._zeropower_via_newtonschulz
    if iterations_in_f32:
        _muon._zeropower_via_newtonschulz = zeropower_f32
    steps = []
    try:
        for t in range(7):
            lrs = [g["lr"] for g in opt.param_groups]
            for p, g in zip(params, grads[t]):
                p.grad = None if g is None else g.clone()
            opt.step()
            steps.append({
                "grads": [None if g is None else g.flatten().tolist() for g in grads[t]],
                "lr": lrs,
                "expect_params": [p.detach().flatten().tolist() for p in params],
                "expect_state": [{k: v.flatten().tolist() for k, v in opt.state[p].items()} if p in opt.state else {}
                                 for p in params],
            })
    finally:
        _muon._zeropower_via_newtonschulz = original
    return initial, steps, opt


def largest_difference(steps_a, steps_b):
    worst = 0.0
    for a, b in zip(steps_a, steps_b):
        for pa, pb in zip(a["expect_params"], b["expect_params"]):
            worst = max([worst] + [abs(x - y) for x, y in zip(pa, pb)])
    return worst


def main(out_dir):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for seed, (name, options, shapes, groups, dtype, nulls) in enumerate(CASES):
        initial, steps, opt = run(options, shapes, groups, dtype, nulls, 1000 + seed)
        _, steps_f32, _ = run(options, shapes, groups, dtype, nulls, 1000 + seed, iterations_in_f32=True)
        spread = largest_difference(steps, steps_f32)
        defaults = {k: (list(v) if isinstance(v, tuple) else v) for k, v in opt.defaults.items()
                    if k not in ("foreach", "differentiable", "capturable", "fused", "maximize")}
        case = {
            "name": name,
            "optimizer": "Muon",
            "options": options,
            "resolved_options": defaults,
            "dtype": "float32" if dtype == torch.float32 else "float64",
            "params": [{"shape": list(p.shape), "data": p.flatten().tolist()} for p in initial],
            "scheduler": None,
            "steps": steps,
            "rtol": 1e-5 if dtype == torch.float32 else 1e-10,
            "atol": max(2 * spread, 1e-6),
            "state_rtol": 1e-5 if dtype == torch.float32 else 1e-10,
            "state_atol": 1e-6 if dtype == torch.float32 else 1e-13,
            "bf16_spread": spread,
        }
        if groups:
            case["param_groups"] = [{"params": idx, "options": over} for idx, over in groups]
        (out / f"{name}.json").write_text(json.dumps(case) + "\n")
        print(f"{name}: spread {spread:.3g}, atol {case['atol']:.3g}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/muon")
