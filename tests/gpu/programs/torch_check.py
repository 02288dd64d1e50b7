"""A PyTorch job for the interception library's GPU tests; prints one JSON line.

Usage: torch_check.py memory BLOCK_BYTES | spin MATMULS
"""

import json
import sys
import time

import torch


def memory(block: int) -> dict[str, object]:
    """Allocate blocks until PyTorch runs out of memory, free them, allocate again, capture a graph."""
    out: dict[str, object] = {"info": list(torch.cuda.mem_get_info()), "oom": False}
    blocks = []
    try:
        while len(blocks) < 64:
            blocks.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        out["oom"] = True
    out["blocks"] = len(blocks)
    del blocks
    torch.cuda.empty_cache()
    again = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
    out["again"] = True
    del again
    torch.cuda.empty_cache()
    static = torch.randn(1024, 1024, device="cuda")
    static @ static  # cuBLAS starts outside the capture, as PyTorch asks of every captured workload
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        product = static @ static
    graph.replay()
    torch.cuda.synchronize()
    out["graph"] = bool(torch.isfinite(product).all().item())
    return out


def spin(matmuls: int) -> dict[str, object]:
    """Queue matrix products without synchronising in between (a job that launches far ahead)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    started = time.monotonic()
    for _ in range(matmuls):
        a @ a
    torch.cuda.synchronize()
    return {"seconds": time.monotonic() - started}


if __name__ == "__main__":
    result = memory(int(sys.argv[2])) if sys.argv[1] == "memory" else spin(int(sys.argv[2]))
    print(json.dumps(result))
