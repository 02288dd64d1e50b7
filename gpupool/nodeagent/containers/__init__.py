"""The node's pod containers: which container and pod a process runs in, and refusing a
container's opens of GPU device files.

A process names its container only through its cgroup path; the pod watch names the pod and
container behind each runtime container ID (the container directory). The container gate turns
deciders' refusals per container into the cgroup-device gate's refusals per cgroup. Built on
:mod:`gpupool.nodeagent.linux`; the monitor, the lending rules and the risk checks use it.
"""
