"""Inductor's kernel counts for clip_grad_norm_ followed by an optimizer step, compiled together with
torch.compile on the CPU, measured as torch's own test_compiled_optimizers.py counts a step: two Linear(10, 10)
(params 10x10, 10, 10x10, 10), two calls, torch._inductor.metrics.generated_kernel_count. The optimizer's foreach
option is clip_grad_norm_'s too. `optjit counts` prints the numbers this gave (torch 2.15.0, CPU; recorded in
tools/counts.cpp, inductor_cpu_kernels). Without clipping the same method gives the reference's 8 for Adam.
Not part of the build or the tests: run by hand with a torch that has Inductor and a C++ compiler:

    python tools/inductor_clip_counts.py
"""
import json

import torch
from torch._inductor import metrics

CONFIGS = [  # (optimizer, options, norm_type): the clipped rows of tools/counts.cpp that torch.optim has
    (torch.optim.Adam, {}, 2.0),
    (torch.optim.Adam, {"amsgrad": True}, float("inf")),
    (torch.optim.AdamW, {}, 2.0),
    (torch.optim.SGD, {"momentum": 0.9}, 2.0),
]


def count(cls, options, norm_type, foreach):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    opt = cls(params, lr=0.01, foreach=foreach, **options)

    @torch.compile()
    def clipped_step():
        torch.nn.utils.clip_grad_norm_(params, 1.0, norm_type=norm_type, foreach=foreach)
        opt.step()

    metrics.reset()
    clipped_step()
    clipped_step()
    return metrics.generated_kernel_count


def main():
    rows = []
    for cls, options, norm_type in CONFIGS:
        for foreach in (False, True):
            rows.append({"optimizer": cls.__name__, "options": options, "norm_type": norm_type, "foreach": foreach,
                         "inductor_kernels": count(cls, options, norm_type, foreach)})
    print(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
