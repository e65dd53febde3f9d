"""The peers' own token dispatchers that the alltoall suite times beside ours, as one registry.

Each entry builds a :class:`~moe_repro.components.alltoall.base.Dispatcher` around a peer's
dispatcher (components/moe/peer_ep.py), which delivers the flat layout every one of our
dispatchers delivers, so the suite runs it on the same routing, rows and ranks and checks it
against the same reference. The entry declares what callers may rely on, so that the suite
reads the registry and never branches on a name. Importing this module imports no tensor
library and no peer: the builder imports them when called.

Adding one: a Dispatcher adapter in peer_ep.py and one ``register(PeerDispatcher(...))`` below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class PeerDispatcher:
    name: str  # the alltoall suite offers the paths "<name>-dispatch" and "<name>-combine"
    impl: str  # its entry in peers.PEER_IMPLS: the package it needs and the install hint
    label: str  # how reports call it
    alltoall: str  # the registered all-to-all it runs (what --algo it is compared under)
    stages: tuple[str, ...]  # the stages its dispatch times when asked (Dispatcher.timings)
    contiguous_experts_only: bool  # needs each rank's experts consecutive (placement contiguous)
    torch_groups_only: bool  # runs on torch.distributed process groups (not on MPI)
    # (EP communicator, expert -> rank, hidden, top_k) -> Dispatcher
    build: Callable[..., object]

    def require(self) -> str:
        """The peer package's version; PeerUnavailable (one line, the install hint) if absent."""
        from moe_repro.components.moe.peers import require_peer

        return require_peer(self.impl)


PEER_DISPATCHERS: dict[str, PeerDispatcher] = {}


def register(peer: PeerDispatcher) -> PeerDispatcher:
    if peer.name in PEER_DISPATCHERS:
        raise ValueError(f"peer dispatcher {peer.name!r} is already registered")
    PEER_DISPATCHERS[peer.name] = peer
    return peer


def peer_dispatcher_names() -> tuple[str, ...]:
    return tuple(PEER_DISPATCHERS)


def get_peer_dispatcher(name: str) -> PeerDispatcher:
    if name not in PEER_DISPATCHERS:
        raise ValueError(
            f"peer dispatcher must be one of {', '.join(PEER_DISPATCHERS)}, got {name!r}"
        )
    return PEER_DISPATCHERS[name]


def _megatron(comm, expert_to_rank, hidden: int, top_k: int):
    from moe_repro.components.moe.peer_ep import MegatronDispatcher

    return MegatronDispatcher(comm, expert_to_rank, hidden, top_k)


register(
    PeerDispatcher(
        name="megatron",
        impl="megatron",
        label="Megatron-core MoEAlltoAllTokenDispatcher",
        alltoall="flat",
        stages=("permute and counts", "all-to-all"),
        contiguous_experts_only=True,
        torch_groups_only=True,
        build=_megatron,
    )
)
