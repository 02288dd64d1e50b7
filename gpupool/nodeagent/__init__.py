"""The node agent: the kubelet device plugin, GPU inventory and health, the mapping of Allocate calls
to the scheduler's assignments, and the grants containers get."""
