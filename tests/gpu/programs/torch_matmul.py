"""A PyTorch matmul for tests/gpu/test_remote_pytorch_gpu.py: two N x N float32 matrices made on
the CPU from a fixed seed, multiplied on the GPU (cuBLAS's SGEMM: no PyTorch kernel of its own runs),
the product saved with torch.save; then one of PyTorch's own kernels (torch.ones summed on the card).
Prints one JSON line: the timings in ms, what torch.cuda.mem_get_info said (through the GPU client:
the booked share), and the kernel's sum or its error.

usage: torch_matmul.py N OUT
"""

import json
import sys
import time

import torch

size, out = int(sys.argv[1]), sys.argv[2]
generator = torch.Generator().manual_seed(25)
a = torch.randn(size, size, generator=generator)
b = torch.randn(size, size, generator=generator)
started = time.perf_counter()
on_card = a.cuda(), b.cuda()
uploaded = time.perf_counter()
product = on_card[0] @ on_card[1]
torch.cuda.synchronize()
multiplied = time.perf_counter()
result = product.cpu()
downloaded = time.perf_counter()
torch.save(result, out)
free, total = torch.cuda.mem_get_info()
try:
    kernel: object = torch.ones(4, device="cuda").sum().item()
except RuntimeError as error:  # a CUDA error, as the stand-in driver gives for PyTorch's cubins
    kernel = str(error).splitlines()[0]
print(json.dumps({"upload_ms": 1000 * (uploaded - started), "matmul_ms": 1000 * (multiplied - uploaded),
                  "download_ms": 1000 * (downloaded - multiplied), "free": free, "total": total,
                  "kernel": kernel}))
