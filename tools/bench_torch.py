"""PyTorch's anchors for `optjit bench`, printed as one JSON object keyed by shape. Not part of the build or the
tests: optjit bench runs it where a Python with torch is found (OPTJIT_TORCH_PYTHON).

    bench_torch.py --device cuda              Adam(fused=True) and Adam(foreach=True), f32, on optjit bench --device
                                              cuda's shapes, timed with CUDA events (median of 7 batches of 20 steps)
    bench_torch.py --cpu-clip 1000x10000 --threads 2
                                              on the CPU: clip_grad_norm_(foreach=True) then Adam(fused=True), and
                                              Adam(fused=True) alone, f32, with `threads` threads (medians)
    bench_torch.py --cpu-muon 12 --threads 2  on the CPU: torch.optim.Muon (lr 0.02, f32) over the matrices of that
                                              many d=768 Transformer layers (optjit bench's Muon rows), its own step
                                              and torch.compile(opt.step): ms per step (medians) and the compiled
                                              step's first call (its compile)"""
import argparse
import json
import time

import torch


def cuda_step_ms(params, **options):
    opt = torch.optim.Adam(params, lr=1e-3, **options)
    for _ in range(3):
        opt.step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(7):
        start.record()
        for _ in range(20):
            opt.step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 20)
    return sorted(times)[len(times) // 2]


def cuda_anchors():
    if not torch.cuda.is_available():
        raise SystemExit("bench_torch.py --device cuda: torch sees no CUDA GPU here")
    out = {}
    for count, numel in [(1, 100_000_000), (1000, 100_000), (10000, 1000)]:
        params = [torch.ones(numel, device="cuda", requires_grad=True) for _ in range(count)]
        for p in params:
            p.grad = torch.full_like(p, 1e-3)
        out[f"{count}x{numel}"] = {
            "fused_ms": cuda_step_ms(params, fused=True),
            "foreach_ms": cuda_step_ms(params, foreach=True),
        }
        del params
        torch.cuda.empty_cache()
    return out


def cpu_median_ms(step, repeats=15):
    for _ in range(3):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def cpu_clip_anchors(shape, threads):
    count, numel = (int(n) for n in shape.split("x"))
    torch.set_num_threads(threads)
    params = [torch.ones(numel, requires_grad=True) for _ in range(count)]
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)

    def clipped():
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()

    return {shape: {"clip_fused_ms": cpu_median_ms(clipped), "fused_ms": cpu_median_ms(opt.step)}}


def transformer_matrices(layers, d=768):
    return [shape for _ in range(layers) for shape in ((3 * d, d), (d, d), (4 * d, d), (d, 4 * d))]


def cpu_muon_anchors(layers, threads):
    torch.set_num_threads(threads)

    def muon():
        generator = torch.Generator().manual_seed(0)
        params = [torch.randn(s, generator=generator, requires_grad=True) for s in transformer_matrices(layers)]
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        return torch.optim.Muon(params, lr=0.02)

    out = {"muon_ms": cpu_median_ms(muon().step, repeats=5)}
    compiled = torch.compile(muon().step)
    start = time.perf_counter()
    compiled()
    out["compiled_first_ms"] = (time.perf_counter() - start) * 1e3
    out["compiled_ms"] = cpu_median_ms(compiled, repeats=5)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", choices=["cuda"], help="the GPU anchors (the default)")
    parser.add_argument("--cpu-clip", metavar="COUNTxNUMEL")
    parser.add_argument("--cpu-muon", metavar="LAYERS", type=int)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    if args.cpu_muon:
        print(json.dumps(cpu_muon_anchors(args.cpu_muon, args.threads)))
    else:
        print(json.dumps(cpu_clip_anchors(args.cpu_clip, args.threads) if args.cpu_clip else cuda_anchors()))


if __name__ == "__main__":
    main()
