"""HTTP adapters: the kube-scheduler extender v1 wire types and the aiohttp endpoints."""
