"""The extender's HTTP adapter: extender v1 wire types, aiohttp endpoints, answer encoding."""
