"""bench_attention_torch.py: the reference for perf/bench_attention: torch's scaled_dot_product_attention (flash
backend, causal, GQA) at the same shapes, forward and backward, median ms per call and TFLOP/s (causal FLOPs:
forward 4 B heads L^2 hd / 2, backward 2.5x), so the two tables can be read side by side.

    python3 perf/bench_attention_torch.py [--reps 10]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [  # name, B, L, query heads, KV heads, head_dim: as in bench_attention.cu
    ("qwen2.5-0.5b", 8, 1024, 14, 2, 64),
    ("qwen2.5-0.5b", 32, 256, 14, 2, 64),
    ("qwen2.5-1.5b", 8, 1024, 12, 2, 128),
    ("qwen2.5-7b", 4, 1024, 28, 4, 128),
    ("llama-8b", 4, 2048, 32, 8, 128),
]


def median_ms(fn, reps):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def bench(name, B, L, nh, nkv, hd, dtype, reps):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = (torch.rand(B, nh, L, hd, device="cuda", generator=g) * 4 - 2).to(dtype).requires_grad_()
    k = (torch.rand(B, nkv, L, hd, device="cuda", generator=g) * 4 - 2).to(dtype).requires_grad_()
    v = (torch.rand(B, nkv, L, hd, device="cuda", generator=g) * 2 - 1).to(dtype).requires_grad_()
    dout = (torch.rand(B, nh, L, hd, device="cuda", generator=g) * 2 - 1).to(dtype)
    # The flash backend takes no enable_gqa: the KV heads are expanded to the query heads first, as transformers'
    # sdpa path does for Qwen2 (repeat_kv), and that expansion is timed with the call.
    def fwd():
        kk = k.repeat_interleave(nh // nkv, dim=1)
        vv = v.repeat_interleave(nh // nkv, dim=1)
        return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with torch.no_grad():
            tf = median_ms(fwd, reps)
        out = fwd()
        tb = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), reps)
    flop_f = 4.0 * B * nh * L * L * hd / 2
    tflops = lambda flop, ms: flop / (ms * 1e-3) / 1e12
    dt = "bf16" if dtype == torch.bfloat16 else "f16"
    print(f"{name:<14} {dt} B{B} L{L} h{nh}/{nkv} d{hd}")
    print(f"  forward  sdpa flash {tf:8.3f} ms {tflops(flop_f, tf):6.1f} TFLOP/s")
    print(f"  backward sdpa flash {tb:8.3f} ms {tflops(2.5 * flop_f, tb):6.1f} TFLOP/s  (autograd.grad of q, k, v)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    print(f"bench_attention_torch on {torch.cuda.get_device_name()}, torch {torch.__version__}, median of {args.reps}")
    for s in SHAPES:
        bench(*s, torch.bfloat16, args.reps)
    bench(*SHAPES[0], torch.float16, args.reps)


if __name__ == "__main__":
    main()
