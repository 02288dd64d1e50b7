"""Bounded servers: connection caps and handshake/header deadlines for every port gpupool opens.

Why a package of its own beside the products: the extender's ports and the node agent's ports face
the same attack (connections opened and left silent, each holding a TLS buffer, a protocol and a
task until something closes it), and the two products may share only what sits below them or
beside everything. It imports nothing of gpupool (a contract in ``.importlinter``).
"""
