"""A cluster whose node n1 lends card 0: :mod:`gpupool.testing.lending_world`, where the lending
benchmark imports it too."""

from gpupool.testing.lending_world import (
    CARD,
    LENT_MIB,
    NAMES,
    OWNER,
    START,
    lendable,
    lending_node,
    lending_world,
    owner,
    waiting,
)

__all__ = ["CARD", "LENT_MIB", "NAMES", "OWNER", "START", "lendable", "lending_node", "lending_world", "owner",
           "waiting"]
