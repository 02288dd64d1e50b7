"""Nodes whose scheduling inputs are identical, so that one of them is evaluated for all.

Why: a pod shape the scheduler has not seen (or a shape cache entry dropped since) is checked and
scored on every node of the cluster, and at 5,000 nodes that pass is the filter's longest step. In
a fresh or lightly used cluster most nodes are the same machine in the same state (all cards idle,
the same CPU and memory free), and feasibility and a node-local policy's score are functions of a
node's row of the ledger: nodes with equal rows get equal answers. Grouping them first and
evaluating one node per group does the work once per distinct state instead of once per node.

The key is every per-node input the feasibility masks (:mod:`gpupool.core.feasibility`) and the
node-local policies that declare :attr:`PlacementPolicy.scores_from_ledger_rows` read: the node's
row of every ledger array (presence, CPU and memory total and free, card count, and per card its
existence, health, model, kind, memory and compute total and free, mode and holders), the
request's card scope mask when it has one, and the node's topology (a node that publishes one is
never grouped: its cards' links are compared by no key here). Nodes are grouped by a hash of the
key and every member is then compared with its group's first node element by element; a member
that differs (a hash collision) is evaluated on its own, so equal groups never rest on the hash.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.state import BoolArray, ClusterState, IntArray

GROUP_FROM_ROWS = 512
"""Fewest rows recomputed at once for which grouping is tried: a shape's first pass over a large
cluster, not the few rows that a booking changes between two filters of one shape."""

_NODE_INPUTS = ("present", "cpu_total", "cpu_free", "mem_total", "mem_free", "card_count")
_CARD_INPUTS = ("card_exists", "card_healthy", "card_model", "card_virtual", "card_mem_total", "card_mem_free",
                "card_compute_total", "card_compute_free", "card_mode", "card_holders")


IDS_PER_ROW = 4
"""Distinct states remembered per row of the ledger before the numbering starts afresh (bounds the
memory of a ledger whose nodes keep changing)."""


class RowGroups:
    """Numbers the states of a :class:`ClusterState`'s rows (see the module doc): two rows have the
    same number exactly when their scheduling inputs are equal.

    Each row's number is kept with the node version it was taken at
    (:attr:`gpupool.core.state.ClusterState.node_version`, which every change of a row moves), so
    only rows that changed since are read again: a call costs the rows that changed, not the cluster.
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._topology: tuple[int, IntArray] | None = None
        self._ids: dict[bytes, int] = {}
        self._row_id: IntArray = np.zeros(0, dtype=np.int64)
        self._row_version: IntArray = np.zeros(0, dtype=np.int64)
        self._width = -1
        self._weights: IntArray = np.zeros(0, dtype=np.int64)

    def _topology_token(self) -> IntArray:
        """Per row, 0 without a published topology, else a number no other row has (kept per layout)."""
        state = self.state
        memo = self._topology
        if memo is None or memo[0] != state.layout_version or len(memo[1]) != state.size:
            token = np.array([0 if spec.topology is None else row + 1 for row, spec in enumerate(state.specs)],
                             dtype=np.int64)
            memo = self._topology = (state.layout_version, token)
        return memo[1]

    def key(self, rows: IntArray) -> IntArray:
        """``[rows, inputs]``: every scheduling input of each row (but the card scope), as integers."""
        state = self.state
        columns = [getattr(state, name).take(rows) for name in _NODE_INPUTS]
        columns.append(self._topology_token().take(rows))
        parts = [np.stack(columns, axis=1)]
        parts += [getattr(state, name).take(rows, 0) for name in _CARD_INPUTS]
        key: IntArray = np.concatenate([p.astype(np.int64, copy=False) for p in parts], axis=1)
        return key

    def state_ids(self, rows: IntArray) -> IntArray:
        """Per row of ``rows``, the number of its state: equal exactly when the :meth:`key` rows are."""
        state = self.state
        size = state.size
        width = len(_NODE_INPUTS) + 1 + len(_CARD_INPUTS) * state.max_cards
        if width != self._width or len(self._ids) > IDS_PER_ROW * size + 64:
            self._ids.clear()  # start afresh: a new width of the ledger, or too many states kept
            self._row_id = np.zeros(0, dtype=np.int64)
            self._row_version = np.zeros(0, dtype=np.int64)
            self._width = width
        if len(self._row_id) < size:  # rows added since: never numbered
            grown = size - len(self._row_id)
            self._row_id = np.concatenate([self._row_id, np.zeros(grown, dtype=np.int64)])
            self._row_version = np.concatenate([self._row_version, np.full(grown, -1, dtype=np.int64)])
        versions = state.node_version.take(rows)
        outdated = self._row_version.take(rows) != versions
        if outdated.any():
            changed = rows[outdated]
            self._row_id[changed] = self._number(self.key(changed))
            self._row_version[changed] = versions[outdated]
        found: IntArray = self._row_id.take(rows)
        return found

    def _number(self, key: IntArray) -> IntArray:
        """The state number of each row of ``key``: the same for equal rows, from the remembered ones.

        Rows are first sorted into classes by a hash of the row (vectorised), each class's first row
        is looked up by its bytes, and every other row is compared with its class's first element by
        element; a row that differs (a hash shared by unequal rows) is looked up by its own bytes."""
        width = key.shape[1]
        if len(self._weights) != width:  # odd multipliers: a change of any column moves the hash
            weights: IntArray = np.asarray(np.random.default_rng(width).integers(1, 2**62, width), dtype=np.int64)
            self._weights = weights | 1
        hashed = key @ self._weights  # wraps modulo 2**64, which a hash may
        _, first, member_of = np.unique(hashed, return_index=True, return_inverse=True)
        member_of = member_of.reshape(-1)
        ids = self._ids
        size = width * key.itemsize  # each head's bytes, cut from one copy (cheaper than a row each)
        blob = np.ascontiguousarray(key.take(first, 0)).tobytes()
        heads = np.array([ids.setdefault(blob[at:at + size], len(ids)) for at in range(0, len(blob), size)],
                         dtype=np.int64)
        numbers: IntArray = np.asarray(heads.take(member_of), dtype=np.int64)
        differs = (key != key.take(first.take(member_of), 0)).any(axis=1)
        for i in differs.nonzero()[0].tolist():
            numbers[i] = ids.setdefault(key[i].tobytes(), len(ids))
        return numbers

    def group(self, rows: IntArray, scope_mask: BoolArray | None) -> tuple[IntArray, IntArray]:
        """``(first, member_of)``: positions in ``rows`` of one row per group, and for each row the
        index into ``first`` of its group; rows of one group have equal inputs, the request's card
        scope mask included."""
        ids = self.state_ids(rows)
        if scope_mask is None:
            _, first, member_of = np.unique(ids, return_index=True, return_inverse=True)
        else:  # the state and the row of the scope mask together
            both = np.concatenate([ids[:, None], scope_mask.take(rows, 0).astype(np.int64)], axis=1)
            _, first, member_of = np.unique(both, axis=0, return_index=True, return_inverse=True)
        return first.astype(np.int64, copy=False), member_of.reshape(-1).astype(np.int64, copy=False)
