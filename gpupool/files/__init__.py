"""Small-file writing every component shares: a file replaced whole, never seen half-written.

Standard library only and nothing of gpupool (an import contract), so the node agent, the GPU
server and the tools may all use it without depending on each other.
"""
