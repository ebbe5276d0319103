"""PyTorch's anchors for `optjit bench --device cuda`: Adam(fused=True) and Adam(foreach=True), fp32, on the
same shapes, timed with CUDA events (median of 7 batches of 20 steps). Prints one JSON object keyed by shape.
Not part of the build or the tests: run only where torch and a GPU are present."""
import json
import torch


def step_ms(params, **options):
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


def main():
    if not torch.cuda.is_available():
        raise SystemExit(1)
    out = {}
    for count, numel in [(1, 100_000_000), (1000, 100_000), (10000, 1000)]:
        params = [torch.ones(numel, device="cuda", requires_grad=True) for _ in range(count)]
        for p in params:
            p.grad = torch.full_like(p, 1e-3)
        out[f"{count}x{numel}"] = {"fused_ms": step_ms(params, fused=True), "foreach_ms": step_ms(params, foreach=True)}
        del params
        torch.cuda.empty_cache()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
