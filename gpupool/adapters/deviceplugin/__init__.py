"""The kubelet device-plugin protocol (v1beta1) over unix sockets, with grpcio's asyncio API."""
