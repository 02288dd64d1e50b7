"""Kubernetes plumbing: annotation codecs, pod views, the pod source and the node publisher."""
