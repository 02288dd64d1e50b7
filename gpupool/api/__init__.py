"""The contract every component shares: resource names, annotation schemas and codecs, the container
environment. It depends on the core's model only, so the extender, the node agent and tools agree on
every name and format by importing one place."""
