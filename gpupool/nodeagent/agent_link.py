"""The node agent's live view, for the parts built before it.

The agent is built last, with its collaborators in its constructor (the lending part, the DRA
driver's claims). Some of those parts read what only the agent knows once it runs: its cards with
cordons applied, the pods kubelet listed at its last read, its device-list wake-up. They are given
this link's methods, and the link is joined to the agent right after the agent is built; nothing
calls them before (the parts run only with the agent).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpupool.nodeagent.agent import NodeAgent
    from gpupool.nodeagent.gpu_inventory import GpuInventory
    from gpupool.nodeagent.types import PodView


class AgentLink:
    """Forwards to the agent it is joined to; a call before :meth:`join` is a wiring mistake."""

    def __init__(self) -> None:
        self._agent: NodeAgent | None = None

    def join(self, agent: NodeAgent) -> None:
        self._agent = agent

    @property
    def agent(self) -> NodeAgent:
        if self._agent is None:
            raise RuntimeError("the node agent is read before it was built (AgentLink.join not called)")
        return self._agent

    def inventory(self) -> GpuInventory:
        """The agent's cards now (cordoned ones unhealthy)."""
        return self.agent.inventory

    def listed_pods(self) -> list[PodView]:
        """The pods kubelet listed at the agent's last PodResources read."""
        return self.agent.listed_pods()

    async def devices_changed(self) -> None:
        """Wake every ListAndWatch stream of the agent."""
        await self.agent.devices_changed()
