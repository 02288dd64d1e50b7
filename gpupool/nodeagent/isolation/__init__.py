"""Enforcing the shares: the backends (interception library, MPS, none), chosen per node."""
