"""The kubelet device-plugin protocol (v1beta1) and the PodResources client over unix sockets, with
grpcio's asyncio API."""
