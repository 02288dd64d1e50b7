"""Idle-GPU lending on the node: the four priority rules at open time, reclaim, lent devices,
the lendable annotation and the checkpoint protocol (docs/lending.md)."""
