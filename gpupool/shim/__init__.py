"""The interception library that enforces memory and compute shares inside containers.

The library itself is C (``src/``, built with nothing but a C compiler); this package ships its
sources and builds them (:mod:`gpupool.shim.build`). It imports nothing but the standard library,
so the node agent, the command line and the tests may all use it. How the library works, the
format of its shared region and its known limits: docs/isolation.md.
"""
