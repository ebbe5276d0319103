"""Inductor's kernel counts for clip_grad_norm_ followed by an optimizer step, compiled together with
torch.compile on the CPU, measured as torch's own test_compiled_optimizers.py counts a step: two Linear(10, 10)
(params 10x10, 10, 10x10, 10), two calls, torch._inductor.metrics.generated_kernel_count. The optimizer's foreach
option is clip_grad_norm_'s too. `optjit counts` prints the numbers this gave (torch 2.15.0, CPU; recorded in
tools/counts.cpp, inductor_cpu_kernels). Without clipping the same method gives the reference's 8 for Adam. It also
compiles Adafactor's step as one graph (capture_scalar_outputs=True: its step_t.item() breaks the graph otherwise),
which Inductor refuses single-tensor.
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


def two_linear_params():
    """The params of two Linear(10, 10), with grads, after resetting Dynamo: what every count steps."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def count(cls, options, norm_type, foreach):
    params = two_linear_params()
    opt = cls(params, lr=0.01, foreach=foreach, **options)

    @torch.compile()
    def clipped_step():
        torch.nn.utils.clip_grad_norm_(params, 1.0, norm_type=norm_type, foreach=foreach)
        opt.step()

    metrics.reset()
    clipped_step()
    clipped_step()
    return metrics.generated_kernel_count


def adafactor_whole_graph(options, norm_type, foreach):
    """Inductor's kernels for torch.optim.Adafactor's step (clipped first when norm_type is given), compiled as one
    graph as count() compiles the others. Its step_t.item() breaks the graph unless capture_scalar_outputs is set, so
    it is set here. Where Inductor fails, the error's type and first line instead (torch 2.15, CPU, single-tensor:
    GuardOnDataDependentSymNode, from lerp's decomposition on the data-dependent beta2 term)."""
    params = two_linear_params()
    opt = torch.optim.Adafactor(params, lr=0.01, foreach=foreach, **options)

    @torch.compile(fullgraph=True)
    def step():
        if norm_type is not None:
            torch.nn.utils.clip_grad_norm_(params, 1.0, norm_type=norm_type, foreach=foreach)
        opt.step()

    torch._dynamo.config.capture_scalar_outputs = True
    try:
        metrics.reset()
        step()
        first = metrics.generated_kernel_count
        step()
        return {"inductor_kernels": metrics.generated_kernel_count, "first_call": first}
    except Exception as error:  # noqa: BLE001 - the failure is the measurement
        lines = [line for line in str(error).splitlines() if "Error" in line or "Guard" in line]
        return {"inductor_kernels": None, "error": type(error).__name__, "message": lines[0] if lines else ""}
    finally:
        torch._dynamo.config.capture_scalar_outputs = False


ADAFACTOR_CONFIGS = [({}, None), ({"weight_decay": 0.1, "maximize": True}, None), ({}, 2.0)]  # tools/counts.cpp's


def main():
    rows = []
    for cls, options, norm_type in CONFIGS:
        for foreach in (False, True):
            rows.append({"optimizer": cls.__name__, "options": options, "norm_type": norm_type, "foreach": foreach,
                         "inductor_kernels": count(cls, options, norm_type, foreach)})
    for options, norm_type in ADAFACTOR_CONFIGS:
        for foreach in (False, True):
            rows.append({"optimizer": "Adafactor", "options": options, "norm_type": norm_type, "foreach": foreach,
                         **adafactor_whole_graph(options, norm_type, foreach)})
    print(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
