# gpupool:latest, the image deploy/kustomize/base names (extender Deployment and node agent DaemonSet).
#
#   docker build -t gpupool:latest .          (then push it where your nodes pull from and change
#                                               `image:` in the two manifests, or load it into kind)
#
# Two stages: the build stage runs `pip install .` (setuptools, wheel caches, the build's own
# temporary files) and the runtime stage copies only the installed packages, so the image carries
# no pip cache, no build tools and no source checkout. Every dependency ships manylinux wheels for
# amd64 and arm64 (numpy, grpcio, orjson, aiohttp); the only compiled parts are gpupool's own C
# interception library and the remote GPU's server and client (docs/remote-gpu.md), built in the
# build stage (gcc, OpenSSL's headers) and shipped prebuilt in the package, where `gpupool shim path`
# and `gpupool remote-gpu serve|client-path` find them, so the runtime stage needs no compiler
# either (the server links libssl.so.3, which the Python base image carries).
#
# NVIDIA's cuBLAS for the remote GPU server (docs/remote-gpu.md, "cuBLAS") is opt-in, as it adds
# some hundreds of MB: `docker build --build-arg REMOTE_GPU_CUBLAS=1 .` installs the pinned
# nvidia-cublas-cu12 wheel (libcublas.so.12 and libcublasLt.so.12) into the image's Python, where
# `gpupool remote-gpu serve` finds it without any flag. Installed before the sources are copied, so
# a rebuild after a code change reuses its layer.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
ARG REMOTE_GPU_CUBLAS=0
ARG NVIDIA_CUBLAS_VERSION=12.6.4.1
RUN if [ "$REMOTE_GPU_CUBLAS" = 1 ]; then \
      pip install --prefix=/install "nvidia-cublas-cu12==${NVIDIA_CUBLAS_VERSION}"; \
    fi
WORKDIR /src
# Only what `pip install .` reads: the project file, the readme it names, the package.
COPY pyproject.toml README.md ./
COPY gpupool ./gpupool
# --prefix: everything lands under /install, copied as one layer below. pip compiles the .pyc files
# here, so the runtime never needs to write them (the extender runs with a read-only root FS).
RUN pip install --prefix=/install . \
 && PYTHONPATH=/install/lib/python3.11/site-packages /install/bin/gpupool --version \
 && PYTHONPATH=/install/lib/python3.11/site-packages /install/bin/gpupool shim build \
      --output /install/lib/python3.11/site-packages/gpupool/shim/lib/libgpupool-shim.so \
 && PYTHONPATH=/install/lib/python3.11/site-packages /install/bin/gpupool remote-gpu build \
      --into /install/lib/python3.11/site-packages/gpupool/shim/lib

FROM python:3.11-slim
LABEL org.opencontainers.image.title="gpupool" \
      org.opencontainers.image.description="GPU sharing for Kubernetes: scheduler extender and node agent" \
      org.opencontainers.image.licenses="Apache-2.0"
# PYTHONDONTWRITEBYTECODE: never try to write .pyc next to read-only code; PYTHONUNBUFFERED: log
# lines reach `kubectl logs` at once.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /install /usr/local
# nobody: the extender needs no privilege at all. The node agent's DaemonSet overrides this with
# runAsUser 0 because kubelet's socket directories are root-owned (deploy/kustomize/base/node-agent-daemonset.yaml).
USER 65534:65534
ENTRYPOINT ["gpupool"]
CMD ["--help"]
