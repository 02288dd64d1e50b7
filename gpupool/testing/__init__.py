"""Test doubles for gpupool's ports: an in-memory pod API and watch, an in-memory pod source, a fake
kubelet and a fake node, and a generator of node workloads; and the scenes built from them that the
tests and the benchmarks share (Kubernetes objects, a cluster that lends a card, the node agent on
the fake kubelet, stand-in interception-library regions). Tests and benchmarks import them; the
products never do (an import-linter contract keeps it so)."""
