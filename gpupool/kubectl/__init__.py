"""``kubectl gpupool``: a read-only kubectl plugin that shows what gpupool has booked and why a pod waits.

It reads nodes and pods with the user's kubeconfig and books them in a core ledger of its own, with
the same translation the extender uses (:mod:`gpupool.kube.translate`, :mod:`gpupool.api.annotations`),
so its cards, holders and reasons are the extender's. It writes nothing to the cluster.
"""
