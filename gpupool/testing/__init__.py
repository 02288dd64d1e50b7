"""Test doubles for gpupool's ports: an in-memory pod API and watch, an in-memory pod source, a fake
kubelet and a fake node, and a generator of node workloads. Tests and benchmarks import them; the
products never do (an import-linter contract keeps it so)."""
