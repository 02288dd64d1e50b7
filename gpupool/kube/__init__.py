"""Kubernetes translation shared by the extender and the node agent: API objects to the core's
requests and node specs, the pod API port, and client configuration."""
