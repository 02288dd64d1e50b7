"""gpupool: GPU sharing for Kubernetes.

The package is layered (see docs/architecture.md): ``gpupool.core`` is the pure allocation core
shared by the simulator (``gpupool.sim``), the scheduler extender and the node-side device plugin.
"""

__version__ = "0.1.0"
