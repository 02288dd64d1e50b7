"""The GPU job of ``bench/shim_gpu.py``, run in a child process (with or without the interception
library preloaded); prints one JSON line.

    python3 bench/shim_gpu_job.py decode [--requests 8 --tokens 256 --prompt 128]
    python3 bench/shim_gpu_job.py spin [--seconds 8 --size 16384]

``decode``: a decoder-only transformer of about 0.94 B parameters with random weights (bf16; 16
layers, hidden 2048, 16 heads, MLP 8192, vocabulary 32,000) at batch 1 with a key/value cache, as an
inference server's decode loop runs: per request, a prompt's prefill then ``--tokens`` greedy steps,
each step synchronised so its latency is the token's. Prints the time to first token of each
request and the latency of every later token, in milliseconds.

``spin``: matrix products of ``--size`` cubed (long kernels: ~9 ms each at 16384 on an H200),
synchronised one by one for ``--seconds``; prints each product's end time from the loop's start,
from which the parent reads the share of the card the job got over time.

Needs PyTorch with CUDA; imported only when the job runs, so ``--help`` works anywhere.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

LAYERS, HIDDEN, HEADS, MLP, VOCAB = 16, 2048, 16, 8192, 32_000


def decode(requests: int, tokens: int, prompt: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as functional

    torch.manual_seed(0)
    device, dtype = "cuda", torch.bfloat16
    head_dim = HIDDEN // HEADS

    def weight(*shape: int) -> Any:
        return torch.randn(*shape, device=device, dtype=dtype) * 0.02

    embed = weight(VOCAB, HIDDEN)
    layers = [(weight(HIDDEN, 3 * HIDDEN), weight(HIDDEN, HIDDEN), weight(HIDDEN, MLP), weight(MLP, HIDDEN))
              for _ in range(LAYERS)]
    longest = prompt + tokens
    cache = torch.zeros(LAYERS, 2, 1, HEADS, longest, head_dim, device=device, dtype=dtype)

    def norm(x: Any) -> Any:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(dtype)

    def forward(ids: Any, start: int) -> Any:
        x = embed[ids]  # (1, T, HIDDEN)
        length = ids.shape[1]
        for i, (qkv_w, out_w, up_w, down_w) in enumerate(layers):
            q, k, v = (norm(x) @ qkv_w).split(HIDDEN, dim=-1)
            q, k, v = (t.view(1, length, HEADS, head_dim).transpose(1, 2) for t in (q, k, v))
            cache[i, 0, :, :, start:start + length] = k
            cache[i, 1, :, :, start:start + length] = v
            keys, values = cache[i, 0, :, :, :start + length], cache[i, 1, :, :, :start + length]
            attended = functional.scaled_dot_product_attention(q, keys, values, is_causal=length > 1)
            x = x + attended.transpose(1, 2).reshape(1, length, HIDDEN) @ out_w
            x = x + functional.gelu(norm(x) @ up_w) @ down_w
        return (norm(x[:, -1]) @ embed.T).argmax(-1, keepdim=True)

    ttft_ms: list[float] = []
    token_ms: list[float] = []
    with torch.inference_mode():
        forward(torch.randint(0, VOCAB, (1, prompt), device=device), 0)  # warm-up: cuBLAS, kernels
        torch.cuda.synchronize()
        for _ in range(requests):
            ids = torch.randint(0, VOCAB, (1, prompt), device=device)
            started = time.perf_counter()
            nxt = forward(ids, 0)
            torch.cuda.synchronize()
            ttft_ms.append((time.perf_counter() - started) * 1e3)
            for step in range(tokens - 1):
                began = time.perf_counter()
                nxt = forward(nxt, prompt + step)
                torch.cuda.synchronize()
                token_ms.append((time.perf_counter() - began) * 1e3)
    return {"ttft_ms": ttft_ms, "token_ms": token_ms}


def spin(seconds: float, size: int) -> dict[str, Any]:
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    started = time.perf_counter()
    ends: list[float] = []
    while not ends or ends[-1] < seconds:
        a @ a
        torch.cuda.synchronize()
        ends.append(time.perf_counter() - started)
    return {"ends_s": ends}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="job", required=True)
    d = sub.add_parser("decode", help="a decode loop: time to first token and per-token latency")
    d.add_argument("--requests", type=int, default=8)
    d.add_argument("--tokens", type=int, default=256)
    d.add_argument("--prompt", type=int, default=128)
    s = sub.add_parser("spin", help="long matrix products, each one's end time")
    s.add_argument("--seconds", type=float, default=8.0)
    s.add_argument("--size", type=int, default=16384)
    args = parser.parse_args()
    result = decode(args.requests, args.tokens, args.prompt) if args.job == "decode" else spin(args.seconds, args.size)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
