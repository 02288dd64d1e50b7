"""Runs the node agent's device plugins against the fake kubelet: :mod:`gpupool.testing.node_harness`,
where the Allocate benchmark imports it too."""

from gpupool.testing.node_harness import NAMES, Node, admit_all_running, fake_pod, running_node

__all__ = ["NAMES", "Node", "admit_all_running", "fake_pod", "running_node"]
