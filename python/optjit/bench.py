"""python -m optjit.bench: optjit.compile(opt) against torch's own ways to run the same step, on the same torch
tensors: its default step (eager), foreach=True, fused=True and torch.compile(opt.step). Per-step time (median of
batches), the cold compile time of each compiled mode (its first call), and the ratio to torch's fused step (or to its
default step where it has no fused one). A benchmark, never a test.

    python -m optjit.bench                              # Adam and SGD on 1x50M, 1000x10k, 10000x100 and a model
    python -m optjit.bench --shapes 1000x10k --modes optjit,fused --new-grads
    python -m optjit.bench --device cuda                # on a GPU (timed with CUDA events)
    python -m optjit.bench --optimizers adam --shapes 1000x10k --modes optjit,fused --max-grad-norm 1.0
    python -m optjit.bench --optimizers adam --shapes 1000x10k --modes optjit,fused --grad-scaler
    python -m optjit.bench --device cuda --optimizers adafactor --shapes model --modes optjit --profile
    python -m optjit.bench --optimizers muon --shapes transformer12 --modes optjit,eager,torch.compile
    python -m optjit.bench --optimizers adam,adamw8bit,adamw4bit,adamwfp8 --shapes 1x16M --modes optjit,eager

--new-grads gives every param a new grad tensor before each step (zero_grad(set_to_none=True), torch's default), so
the time includes optjit's rebinding; the grads are made outside the timed region. --grad-scaler runs every step as
scaler.step(opt); scaler.update() under a torch.amp.GradScaler (scale 1, so the grads keep their values): optjit's
step is patched with fuse_inf_check=True (the check in its own first pass), "optjit-unfused" is patched without it
(GradScaler's check pass, then the step), and torch's modes take GradScaler's usual paths."""

import argparse
import gc
import inspect
import json
import statistics
import time
import warnings

import torch

import optjit

SHAPES = {
    "1x50M": (1, 50_000_000),
    "1000x10k": (1000, 10_000),
    "10000x100": (10_000, 100),
    "1x16M": (1, 1 << 24),  # whole blocks of 256: quantized by torchao's rule (50M and 10k are not)
}
OPTIMIZERS = {
    "adam": (torch.optim.Adam, dict(lr=1e-3)),
    "sgd": (torch.optim.SGD, dict(lr=1e-3, momentum=0.9)),
    "adafactor": (torch.optim.Adafactor, dict(lr=1e-2)),  # rows and columns: several kernels per step
}
if hasattr(torch.optim, "Muon"):  # torch >= 2.9: matrix products between the kernels, 2-D params only
    OPTIMIZERS["muon"] = (torch.optim.Muon, dict(lr=0.02))
try:  # torchao's low-bit AdamW: its own step is the `eager` mode (a torch.compile'd step per param)
    import torchao.optim as _torchao_optim

    OPTIMIZERS["adamw8bit"] = (_torchao_optim.AdamW8bit, dict(lr=1e-3))
    OPTIMIZERS["adamw4bit"] = (_torchao_optim.AdamW4bit, dict(lr=1e-3))
    OPTIMIZERS["adamwfp8"] = (_torchao_optim.AdamWFp8, dict(lr=1e-3))
except ImportError:
    pass
MODES = ("optjit", "optjit-unfused", "eager", "foreach", "fused", "torch.compile")


def state_bytes_per_param(opt, params):
    """The optimizer state's bytes per param element: every state tensor's (a torchao state's codes and scales)."""
    total = 0
    for p in params:
        for value in opt.state[p].values():
            for t in (value.codes, value.scale) if hasattr(value, "codes") else (value,):
                if isinstance(t, torch.Tensor) and t.dim() > 0:  # not the 0-d step
                    total += t.numel() * t.element_size()
    return total / sum(p.numel() for p in params)


def model_shapes():
    """A real model's parameter shapes: a 6-layer Transformer encoder, d_model 512 (~19M elements, 74 tensors)."""
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048)
    with torch.device("meta"):
        encoder = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
    return [tuple(p.shape) for p in encoder.parameters()]


def transformer_matrices(layers=12, d=768):
    """The matrices of a GPT-2-small-sized Transformer (Muon's params): per layer the attention's in- and
    out-projections and the MLP's two, 85M elements over 12 layers."""
    return [shape for _ in range(layers) for shape in ((3 * d, d), (d, d), (4 * d, d), (d, 4 * d))]


def make_params(shapes, device, seed=0):
    generator = torch.Generator(device=device).manual_seed(seed)
    params = [torch.randn(shape, device=device, generator=generator, requires_grad=True) for shape in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=device, generator=generator) * 1e-3
    return params


class Timer:
    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn):
        """Seconds one call of fn takes, device work included."""
        self.sync()
        start = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - start


def make_step(mode, opt, params, args):
    """One step of `mode`; with max_grad_norm, clipped first: fused into optjit's step, and
    torch.nn.utils.clip_grad_norm_(foreach=True) before torch's. With grad_scaler, under a GradScaler."""
    max_grad_norm = args.max_grad_norm
    if args.grad_scaler:
        if max_grad_norm is not None:
            raise SystemExit("--grad-scaler and --max-grad-norm: measure one at a time")
        scaler = torch.amp.GradScaler(torch.device(args.device).type, init_scale=1.0, growth_interval=10**9)
        scaler.scale(torch.ones((), device=args.device))  # makes its scale tensor, as a first loss would
        patched = optjit.patch(opt, fuse_inf_check=mode == "optjit") if mode.startswith("optjit") else None
        step = torch.compile(opt.step) if mode == "torch.compile" else opt.step
        if mode == "torch.compile":
            opt.step = step

        def scaled_step():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # GradScaler's grad_scaler= contract
                scaler.step(opt)
            scaler.update()

        scaled_step.metrics = patched.metrics if patched is not None else None
        return scaled_step
    if mode == "optjit-unfused":
        raise SystemExit("the optjit-unfused mode measures GradScaler's own check pass: give --grad-scaler")
    if mode == "optjit":
        return optjit.compile(opt, max_grad_norm=max_grad_norm)
    step = torch.compile(opt.step) if mode == "torch.compile" else opt.step
    if max_grad_norm is None:
        return step

    def clipped_step():
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True)
        step()

    return clipped_step


def measure(mode, cls, options, shapes, args):
    """{step_ms, first_call_ms, and compile_ms for optjit} for one mode; step_ms None where torch refuses it."""
    params = make_params(shapes, args.device)
    kwargs = dict(options)
    if mode in ("foreach", "fused"):
        kwargs[mode] = True
    elif mode == "torch.compile" and "foreach" in inspect.signature(cls).parameters:
        kwargs["foreach"] = True  # what torch.compile traces best
    try:
        opt = cls(params, **kwargs)
    except (RuntimeError, TypeError, ValueError) as error:  # no fused kernel here; no such option; Muon's 1-D params
        return {"step_ms": None, "refused": str(error).splitlines()[0]}
    step = make_step(mode, opt, params, args)
    timer = Timer(args.device)
    grads = [p.grad for p in params]

    def new_grads():
        if args.new_grads:
            for p, g in zip(params, grads):
                p.grad = g.clone()

    if mode == "torch.compile":
        torch._dynamo.reset()
    new_grads()
    first_ms = timer(step) * 1e3
    for _ in range(args.warmup):
        new_grads()
        step()
    batches = []
    for _ in range(args.batches):
        total = 0.0
        for _ in range(args.steps):
            new_grads()
            total += timer(step)
        batches.append(total / args.steps * 1e3)
    result = {
        "step_ms": statistics.median(batches),
        "first_call_ms": first_ms,
        "state_bytes_per_param": state_bytes_per_param(opt, params),
    }
    if args.profile:
        print_profile(mode, step, new_grads, timer, args)
    if mode.startswith("optjit"):  # the first call also makes torch's state tensors and binds them; the compiler alone
        result["compile_ms"] = step.metrics()["compile_ms"]
        result["library_calls"] = step.metrics()["library_calls"]
    del opt, step, params, grads
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def print_profile(mode, step, new_grads, timer, args):
    """torch.profiler's table of the kernels (or CPU ops) of --steps steps of `mode`, by their own time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if timer.cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    timer.sync()
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(args.steps):
            new_grads()
            step()
        timer.sync()
    sort_by = "self_device_time_total" if timer.cuda else "self_cpu_time_total"
    print(f"profile of {args.steps} steps, {mode}:")
    print(profile.key_averages().table(sort_by=sort_by, row_limit=12, max_name_column_width=60), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m optjit.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--optimizers", default="adam,sgd", help=f"comma-separated: {', '.join(OPTIMIZERS)}")
    parser.add_argument(
        "--shapes", default="1x50M,1000x10k,10000x100,model", help=f"{', '.join(SHAPES)}, model, transformer12"
    )
    parser.add_argument(
        "--modes", default="optjit,foreach,fused,torch.compile", help=f"comma-separated: {', '.join(MODES)}"
    )
    parser.add_argument(
        "--max-grad-norm",
        type=float,
        default=None,
        help="clip the grads first: fused into optjit's step, torch's clip_grad_norm_(foreach=True) before torch's",
    )
    parser.add_argument(
        "--grad-scaler", action="store_true", help="every step as scaler.step(opt); scaler.update() under a GradScaler"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed batch")
    parser.add_argument("--batches", type=int, default=5, help="timed batches (the median is reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--new-grads", action="store_true", help="a new grad tensor per param before every step")
    parser.add_argument(
        "--compile-max-tensors",
        type=int,
        default=1000,
        help="skip torch.compile on sets of more tensors (its first call takes tens of minutes on 10000 tensors)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument(
        "--profile", action="store_true", help="after each mode's timing, torch.profiler's table of its kernels"
    )
    args = parser.parse_args(argv)

    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}: expected {', '.join(MODES)}")
    results = []
    for name in args.optimizers.split(","):
        if name not in OPTIMIZERS:
            parser.error(f"unknown optimizer {name!r}: expected {', '.join(OPTIMIZERS)}")
        cls, options = OPTIMIZERS[name]
        for shape_name in args.shapes.split(","):
            if shape_name == "model":
                shapes = model_shapes()
            elif shape_name == "transformer12":
                shapes = transformer_matrices()
            elif shape_name in SHAPES:
                count, numel = SHAPES[shape_name]
                shapes = [(numel,)] * count
            else:
                parser.error(f"unknown shape set {shape_name!r}: expected {', '.join(SHAPES)}, model, transformer12")
            row = {"optimizer": name, "shapes": shape_name, "tensors": len(shapes)}
            for mode in modes:
                if mode == "torch.compile" and len(shapes) > args.compile_max_tensors:
                    row[mode] = {"step_ms": None, "refused": "skipped: over --compile-max-tensors"}
                    continue
                row[mode] = measure(mode, cls, options, shapes, args)
            results.append(row)
            if not args.json:
                print_row(row, modes, header=len(results) == 1)
    if args.json:
        print(json.dumps({"device": args.device, "new_grads": args.new_grads, "results": results}))


def print_row(row, modes, header):
    fused = row.get("fused", {}).get("step_ms")
    eager = row.get("eager", {}).get("step_ms")
    if header:
        cells = [f"{m} ms/step" for m in modes] + (["optjit / fused"] if "optjit" in modes and "fused" in modes else [])
        cells += ["optjit / eager"] if "optjit" in modes and "eager" in modes else []
        cells += ["optjit compile ms", "optjit first call ms", "state B/param"] if "optjit" in modes else []
        cells += ["eager first call ms"] if "eager" in modes else []
        cells += ["torch.compile first call ms"] if "torch.compile" in modes else []
        print("| optimizer | shapes | " + " | ".join(cells) + " |")
        print("|" + "---|" * (len(cells) + 2))
    cells = []
    for mode in modes:
        step_ms = row[mode]["step_ms"]
        cells.append(f"{step_ms:.3f}" if step_ms is not None else f"refused ({row[mode]['refused']})")
    if "optjit" in modes and "fused" in modes:
        cells.append(f"{row['optjit']['step_ms'] / fused:.2f}" if fused else "-")
    if "optjit" in modes and "eager" in modes:
        cells.append(f"{row['optjit']['step_ms'] / eager:.2f}" if eager else "-")
    if "optjit" in modes:
        optjit_row = row["optjit"]
        if "compile_ms" in optjit_row:
            cells += [f"{optjit_row['compile_ms']:.1f}", f"{optjit_row['first_call_ms']:.0f}"]
        else:
            cells += ["-", "-"]
        cells.append(f"{optjit_row['state_bytes_per_param']:.2f}" if "state_bytes_per_param" in optjit_row else "-")
    if "eager" in modes:
        first_ms = row["eager"].get("first_call_ms")
        cells.append(f"{first_ms:.0f}" if first_ms is not None else "-")
    if "torch.compile" in modes:
        first_ms = row["torch.compile"].get("first_call_ms")
        cells.append(f"{first_ms:.0f}" if first_ms is not None else "-")
    print(f"| {row['optimizer']} | {row['shapes']} ({row['tensors']} tensors) | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
