"""Kubernetes plumbing: names, annotation codecs, translation, the watch cache, binding, leases
(extender side), and pod views, the pod source and the node publisher (node side).

Everything that knows the shape of Kubernetes objects lives here, so that the service layer and the
core deal only in gpupool's own data classes.
"""
