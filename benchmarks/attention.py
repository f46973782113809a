"""etfuse's attention kernel against torch eager's scaled_dot_product_attention, same shapes.

    python benchmarks/attention.py [--rounds 7]

Both are called eagerly (`torch.ops.etfuse.sdpa`, the eager kernel library; and
`torch.nn.functional.scaled_dot_product_attention`), interleaved in batches, medians reported, on
torch's threads. Shapes [B, H, L, S, D]: the example llama's prefill and one decoded token against
a 128-token cache (6 heads of 48), ViT-B/16 at 96x96 (12 heads of 64 over 37 tokens), MobileBERT
(4 heads of 32 over 8 tokens), and a 512-token sequence (8 heads of 64), each without a mask and
with an additive causal mask where L == S. Prints us per call and etfuse / torch (issue 14's
target: within 2x).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import kernels as bench  # noqa: E402  (interleaved timing)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import etfuse.backend_ops  # noqa: E402,F401
import etfuse.kernels  # noqa: E402

SHAPES = {
    "llama prefill": (1, 6, 16, 16, 48),
    "llama decode, 128 cached": (1, 6, 1, 128, 48),
    "ViT-B/16 96x96": (1, 12, 37, 37, 64),
    "MobileBERT": (1, 4, 8, 8, 32),
    "512 tokens": (1, 8, 512, 512, 64),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    etfuse.kernels.load()
    torch.manual_seed(0)
    print("# etfuse.sdpa vs torch scaled_dot_product_attention (eager)\n")
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, torch threads {torch.get_num_threads()}; "
          f"us per call, medians of {args.rounds} interleaved rounds\n")
    print("| shape [B, H, L, S, D] | mask | etfuse us | torch us | etfuse / torch |")
    print("|---|---|---:|---:|---:|")
    for name, (b, h, l, s, d) in SHAPES.items():
        q, k, v = torch.randn(b, h, l, d), torch.randn(b, h, s, d), torch.randn(b, h, s, d)
        scale = d ** -0.5
        masks = [None]
        if l == s:
            masks.append(torch.full((l, s), float("-inf")).triu(1))
        for mask in masks:
            got = torch.ops.etfuse.sdpa(q, k, v, mask, scale)
            want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
            t = bench.interleaved({
                "etfuse": lambda: torch.ops.etfuse.sdpa(q, k, v, mask, scale),
                "torch": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale),
            }, args.rounds, 0.05)
            print(f"| {name} {[b, h, l, s, d]} | {'causal' if mask is not None else 'none'} | "
                  f"{t['etfuse'] * 1e6:.1f} | {t['torch'] * 1e6:.1f} | {t['etfuse'] / t['torch']:.2f}x |")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
