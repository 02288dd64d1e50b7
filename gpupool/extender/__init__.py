"""The kube-scheduler extender: filter, prioritize, bind and preempt over the extender v1 JSON protocol.

Its parts: ``service`` (the decisions, on the core), ``cache`` and ``watch`` (the ledger fed by a
list+watch of nodes and pods), ``binder`` (conflict-safe binds), ``lease`` and ``handover`` (HA),
``metrics`` and the ``http`` adapter.
"""
