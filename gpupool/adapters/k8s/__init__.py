"""Kubernetes plumbing of the extender: names, annotation codecs, translation, cache, binding, leases.

Everything that knows the shape of Kubernetes objects lives here, so that the service layer and the
core deal only in gpupool's own data classes.
"""
