"""Remote GPUs' data plane around the C programs of ``gpupool/shim/src/remote``: the GPU server's
supervisor (``gpupool remote-gpu serve``). See docs/remote-gpu.md."""
