"""Builders of Kubernetes JSON objects for the extender's tests: :mod:`gpupool.testing.kube_objects`,
where the benchmarks import them too."""

from gpupool.testing.kube_objects import GIB, HAMI_MIB, container, node, placed_pod, pod

__all__ = ["GIB", "HAMI_MIB", "container", "node", "placed_pod", "pod"]
