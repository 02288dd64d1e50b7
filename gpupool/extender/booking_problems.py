"""Claims the cluster holds that the ledger cannot square: over-committed cards, unreadable assignments.

Why they are tracked (not only logged): both leave a node's cards in a state no new pod may be
placed on. An over-committed card (two bound pods claiming 24 GiB of a 16 GiB card, left by an
older version or a hand edit) is booked claim by claim beyond its capacity, so the fit rules refuse
it until enough claimants have left. A bound pod whose assignment cannot be read holds *some* cards
of its node, nobody knows which: GPU placements on that node are refused with the reason until the
pod ends or its assignment is fixed. Each conflict is counted for ``/metrics`` and reported once per
pod as a Kubernetes Event (the :class:`Notice` queue is drained outside the cache lock).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from gpupool.core.state import ClusterState
from gpupool.extender.bookings import OVERCOMMITTED, UNREADABLE, Notice

log = logging.getLogger(__name__)

ADOPTED_WHOLE = "GpupoolForeignShareUnread"
"""Event reason on a pod another system placed whose share is booked as whole cards."""
MAX_NOTICES = 1000
"""Notices kept for the reporter; older ones are dropped first (each is also logged)."""


class BookingProblems:
    """Over-committed cards per node, unreadable claims per pod, and the notices about them."""

    def __init__(self) -> None:
        self.overcommitted: dict[str, tuple[int, ...]] = {}
        """Per node, the card positions whose claims exceed the card."""
        self.unreadable: dict[str, tuple[str, str]] = {}
        """Per pod, the node it is bound to and why its assignment cannot be read."""
        self.refused_nodes: dict[str, str] = {}
        """Per node with an unreadable claim, why GPU placements there are refused."""
        self._reported: set[tuple[str, str, int]] = set()
        self._notices: deque[Notice] = deque(maxlen=MAX_NOTICES)
        self._adopted_whole: dict[str, str] = {}
        """Per pod reported by :meth:`adopted_whole`, the reason it was reported for."""

    # -------------------------------------------------------------------------- over-commitment
    def cards_over(self, state: ClusterState, node: str, over: tuple[int, ...],
                   uid_of: Callable[[str], str]) -> None:
        """Record that ``over`` are the over-committed cards of ``node`` now; reports each pod
        holding one of them the first time it is seen there."""
        if over:
            self.overcommitted[node] = over
        else:
            self.overcommitted.pop(node, None)
        self._reported = {r for r in self._reported if r[1] != node or r[2] in over}
        for card in over:
            holders = holders_of(state, node, card)
            mib = sum(m for _, m in holders)
            total = int(state.card_mem_total[state.index[node], card])
            message = (f"card {card_index(state, node, card)} of node {node} is over-committed: "
                       f"{', '.join(k for k, _ in holders)} claim {mib} MiB of {total} MiB (or share a whole "
                       "card); it takes no new pods until it is back within its capacity")
            for key, _ in holders:
                if (key, node, card) in self._reported:
                    continue
                self._reported.add((key, node, card))
                log.error("pod %s: %s", key, message)
                self._notices.append(Notice(key, uid_of(key), OVERCOMMITTED, message))

    def overcommitted_cards(self) -> int:
        """How many cards are over-committed now."""
        return sum(len(cards) for cards in self.overcommitted.values())

    def conflicts(self, state: ClusterState) -> dict[str, str]:
        """Per pod holding an over-committed card, which card."""
        found: dict[str, str] = {}
        for node, cards in self.overcommitted.items():
            for card in cards:
                for key, _ in holders_of(state, node, card):
                    found[key] = f"holds over-committed card {card_index(state, node, card)} of node {node}"
        return found

    # ------------------------------------------------------------------------- unreadable claims
    def set_unreadable(self, key: str, uid: str, node: str, problem: str) -> None:
        """``key`` is bound to ``node`` with an assignment that cannot be read."""
        known = self.unreadable.get(key)
        self.unreadable[key] = (node, problem)
        if known is None:
            message = (f"bound to node {node} with an assignment gpupool cannot read ({problem}); no GPU "
                       "pod is placed on that node until the assignment is fixed or the pod ends")
            log.error("pod %s: %s", key, message)
            self._notices.append(Notice(key, uid, UNREADABLE, message))
        self._refresh_refused({node, *(known[:1] if known else ())})

    def clear_unreadable(self, key: str) -> None:
        """``key`` no longer holds an unreadable claim."""
        known = self.unreadable.pop(key, None)
        if known is not None:
            self._refresh_refused({known[0]})

    def unreadable_on(self, node: str) -> frozenset[str]:
        """Pods bound to ``node`` whose assignment cannot be read."""
        return frozenset(key for key, (where, _) in self.unreadable.items() if where == node)

    def _refresh_refused(self, nodes: set[str]) -> None:
        for node in nodes:
            claims = sorted((key, problem) for key, (where, problem) in self.unreadable.items() if where == node)
            if claims:
                key, problem = claims[0]
                more = f" (and {len(claims) - 1} more pods)" if len(claims) > 1 else ""
                self.refused_nodes[node] = (f"pod {key}{more} is bound to this node with an assignment "
                                            f"gpupool cannot read ({problem}); its cards are unknown, so "
                                            "no GPU pod is placed here until it is fixed or the pod ends")
            else:
                self.refused_nodes.pop(node, None)

    # ------------------------------------------------------------------------ adopted, guessed
    def adopted_whole(self, key: str, uid: str, problem: str) -> None:
        """``key``, placed by another system, is booked on whole cards because its annotations do
        not say its share (:mod:`gpupool.kube.adoption`); reported once per pod and reason."""
        if self._adopted_whole.get(key) == problem:
            return
        self._adopted_whole[key] = problem
        log.warning("pod %s: %s", key, problem)
        self._notices.append(Notice(key, uid, ADOPTED_WHOLE, problem))

    def forget_pod(self, key: str) -> None:
        """``key`` is gone: a pod of that name later is reported anew."""
        self._adopted_whole.pop(key, None)

    # --------------------------------------------------------------------------------- notices
    def take_notices(self) -> list[Notice]:
        """The notices not yet taken, oldest first."""
        taken = list(self._notices)
        self._notices.clear()
        return taken


def holders_of(state: ClusterState, node: str, card: int) -> list[tuple[str, int]]:
    """Pods holding card position ``card`` of ``node``, with the memory each claims there."""
    row = state.index[node]
    held = []
    for key in sorted(state.pods_on.get(row, ())):
        per_card = state.placements[key].held_per_card()
        if card in per_card:
            held.append((key, per_card[card][0]))
    return held


def card_index(state: ClusterState, node: str, card: int) -> int:
    """The node's own index of the card at position ``card`` (what users and the node agent see)."""
    spec = state.specs[state.index[node]]
    return spec.cards[card].index if card < len(spec.cards) else card
