"""Where each rank sits: ranks -> nodes -> switch groups -> racks, and which NIC a GPU uses.

Piper Sec. V: on a Dragonfly machine (Frontier) communication cost has four levels: inside a
node (Infinity Fabric), between nodes on one Rosetta switch ("switch group", 4 nodes on
Frontier), between switch groups of one rack, and across racks. Every byte a collective sends is
classified by the pair (source rank, destination rank) into one of ``LINK_CLASSES``;
``inter_node`` bytes are the sum of the last three.

A :class:`Topology` is built from
- a platform profile (a plain dict, e.g. one of components/network/platforms/*.json; see
  :meth:`Topology.from_profile` for the keys read),
- the launcher's context (:class:`moe_repro.runtime.launch.RankContext`: emulated nodes are groups of
  ``ranks_per_node`` consecutive ranks), or
- the environment of torchrun / mpirun / srun (LOCAL_WORLD_SIZE and friends).

Communicators (Piper Sec. V-A): :func:`build_communicators` makes, for every rank,
- ``intra``: the ranks of its node (phases I and III of HALO, stage 2 of RBD);
- ``inter``: the GPUs that share its NIC index across all nodes ("we assign GPUs sharing a NIC
  to the same inter-node communicator"), so its inter-node traffic enters the fabric through its
  own NIC and all NICs of a node inject at once;
- ``world``: every rank (flat all-to-all, HALO phase II's batched P2P as in Alg. 1 line 13).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: comm is imported where communicators are built
    from moe_repro.components.network.comm import Comm

LINK_CLASSES = ("intra_node", "intra_group", "inter_group", "inter_rack")
INTER_NODE_CLASSES = ("intra_group", "inter_group", "inter_rack")


@dataclass(frozen=True)
class Topology:
    """Rank placement of a world of ``nodes * ranks_per_node`` ranks (rank-major by node)."""

    nodes: int
    ranks_per_node: int
    nodes_per_group: int = 0  # nodes on one switch; 0 = all nodes in one group
    groups_per_rack: int = 0  # switch groups per rack; 0 = all groups in one rack
    nics_per_node: int = 1
    nic_of_local_rank: tuple[int, ...] = field(default=())  # GPU-to-NIC affinity; () = round robin

    def __post_init__(self):
        if self.nodes < 1 or self.ranks_per_node < 1:
            raise ValueError(
                f"need nodes >= 1 and ranks_per_node >= 1, got {self.nodes}, {self.ranks_per_node}"
            )
        if self.nics_per_node < 1:
            raise ValueError(f"nics_per_node must be >= 1, got {self.nics_per_node}")
        if self.nic_of_local_rank:
            if len(self.nic_of_local_rank) != self.ranks_per_node:
                raise ValueError(
                    f"nic_of_local_rank has {len(self.nic_of_local_rank)} entries, "
                    f"need one per GPU of a node ({self.ranks_per_node})"
                )
            if not all(0 <= n < self.nics_per_node for n in self.nic_of_local_rank):
                raise ValueError(f"nic_of_local_rank entries must lie in [0, {self.nics_per_node})")

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def from_profile(cls, profile: dict, nodes: int) -> "Topology":
        """From a platform profile dict. Keys read (first found wins; all but GPUs optional):
        ``gpus_per_node`` | ``ranks_per_node``; ``nics_per_node``; ``nodes_per_switch_group`` |
        ``nodes_per_group``; ``switch_groups_per_rack`` | ``groups_per_rack``;
        ``gpu_nic_affinity`` | ``nic_of_gpu`` (list: NIC index per GPU of a node). They may also
        sit under a ``"topology"`` or ``"node"`` sub-dict."""
        flat = dict(profile)
        for sub in ("node", "topology", "network"):
            if isinstance(profile.get(sub), dict):
                flat = {**profile[sub], **flat}

        def pick(*names, default=None):
            for n in names:
                if flat.get(n) is not None:
                    return flat[n]
            return default

        gpus = pick("gpus_per_node", "ranks_per_node", "gcds_per_node")
        if gpus is None:
            raise ValueError("platform profile has no gpus_per_node")
        affinity = pick("gpu_nic_affinity", "nic_of_gpu", default=())
        return cls(
            nodes=int(nodes),
            ranks_per_node=int(gpus),
            nodes_per_group=int(pick("nodes_per_switch_group", "nodes_per_group", default=0)),
            groups_per_rack=int(pick("switch_groups_per_rack", "groups_per_rack", default=0)),
            nics_per_node=int(pick("nics_per_node", default=1)),
            nic_of_local_rank=tuple(int(a) for a in affinity),
        )

    @classmethod
    def from_context(cls, ctx, ranks_per_node: int | None = None) -> "Topology":
        """From a RankContext; ``ranks_per_node`` overrides the context's node grouping."""
        per = int(ranks_per_node or ctx.ranks_per_node)
        if ctx.world_size % per:
            raise ValueError(f"ranks_per_node={per} does not divide world size {ctx.world_size}")
        return cls(nodes=ctx.world_size // per, ranks_per_node=per)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> "Topology":
        """From torchrun / mpirun / srun variables (WORLD_SIZE, LOCAL_WORLD_SIZE, ...)."""
        env = os.environ if env is None else env

        def first(*names):
            for n in names:
                v = str(env.get(n, "")).split("(")[0]
                if v.isdigit():
                    return int(v)
            return None

        world = first("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
        if not world:
            raise ValueError("no launcher world size in the environment (WORLD_SIZE, ...)")
        local = (
            first(
                "LOCAL_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
                "MPI_LOCALNRANKS",
                "SLURM_NTASKS_PER_NODE",
            )
            or world
        )
        if world % local:
            raise ValueError(f"local world size {local} does not divide world size {world}")
        return cls(nodes=world // local, ranks_per_node=local)

    # --- placement ----------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_node

    def group_of(self, rank: int) -> int:
        return self.node_of(rank) // self.nodes_per_group if self.nodes_per_group else 0

    def rack_of(self, rank: int) -> int:
        return self.group_of(rank) // self.groups_per_rack if self.groups_per_rack else 0

    def nic_of(self, rank: int) -> int:
        local = self.local_rank(rank)
        if self.nic_of_local_rank:
            return self.nic_of_local_rank[local]
        # Round robin in blocks: GPUs 2i and 2i+1 share NIC i when there are twice as many
        # GPUs as NICs (Frontier: 8 GCDs, 4 NICs).
        return local * self.nics_per_node // self.ranks_per_node

    def node_ranks(self, node: int) -> list[int]:
        return list(range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node))

    def nic_ranks(self, nic: int) -> list[int]:
        """Every rank, on every node, that injects through NIC index ``nic``."""
        return [r for r in range(self.world_size) if self.nic_of(r) == nic]

    def link_class(self, src: int, dst: int) -> str:
        if self.node_of(src) == self.node_of(dst):
            return "intra_node"
        if self.group_of(src) == self.group_of(dst):
            return "intra_group"
        if self.rack_of(src) == self.rack_of(dst):
            return "inter_group"
        return "inter_rack"

    def is_inter_node(self, src: int, dst: int) -> bool:
        return self.node_of(src) != self.node_of(dst)


# --- byte accounting ---------------------------------------------------------------------------


def bytes_by_link_class(messages, topo: Topology) -> dict[str, int]:
    """Sum (phase, src, dst, nbytes) messages per link class; self-messages are local copies
    and count on no link. Adds ``inter_node`` = the sum of the three inter-node classes."""
    out = {c: 0 for c in LINK_CLASSES}
    for _phase, src, dst, nbytes in messages:
        if src != dst:
            out[topo.link_class(src, dst)] += int(nbytes)
    out["inter_node"] = sum(out[c] for c in INTER_NODE_CLASSES)
    return out


# --- communicators (Piper Sec. V-A) ------------------------------------------------------------


@dataclass
class Communicators:
    """This rank's communicators; each is a Comm adapter from components.network.comm."""

    topo: Topology
    world: Comm
    intra: Comm  # this rank's node
    intra_overlap: Comm  # a second intra-node communicator: HALO phase I runs on it async
    inter: Comm  # GPUs sharing this rank's NIC index, across nodes

    def by_name(self) -> dict[str, Comm]:
        """Each communicator by its field name, each object once (a caller's double may give two
        names one object): what a logger, a profiler or a test walks."""
        seen: dict[int, str] = {}
        for name in ("world", "intra", "intra_overlap", "inter"):
            c = getattr(self, name)
            if c is not None:
                seen.setdefault(id(c), name)
        return {name: getattr(self, name) for name in seen.values()}

    def set_log(self, log: list | None) -> None:
        """Record every message sent through these communicators into ``log`` (or stop)."""
        for c in self.by_name().values():
            c.log = log


def build_communicators(topo: Topology, rank: int, backend: str, mpi_comm=None) -> Communicators:
    """Collective call: every rank of the world must call it, in the same order.

    torch.distributed: ``new_group`` for every node and every NIC index (all ranks create all
    groups, as torch requires). MPI: ``Split`` of ``mpi_comm`` by node and by NIC index.
    """
    from moe_repro.components.network.comm import MPIComm, TorchComm

    if topo.world_size <= rank:
        raise ValueError(f"rank {rank} outside a world of {topo.world_size}")
    node, nic = topo.node_of(rank), topo.nic_of(rank)
    nic_ids = sorted({topo.nic_of(r) for r in range(topo.world_size)})
    if backend == "mpi":
        if mpi_comm is None:
            raise ValueError("backend 'mpi' needs the mpi4py communicator (RankContext.comm)")
        if mpi_comm.Get_size() != topo.world_size:
            raise ValueError(
                f"MPI world has {mpi_comm.Get_size()} ranks, topology {topo.world_size}"
            )
        intra = mpi_comm.Split(color=node, key=rank)
        return Communicators(
            topo=topo,
            world=MPIComm(mpi_comm.Dup(), list(range(topo.world_size))),
            intra=MPIComm(intra, topo.node_ranks(node)),
            intra_overlap=MPIComm(intra.Dup(), topo.node_ranks(node)),
            inter=MPIComm(mpi_comm.Split(color=nic, key=rank), topo.nic_ranks(nic)),
        )

    import torch.distributed as dist

    if dist.get_world_size() != topo.world_size:
        raise ValueError(
            f"torch.distributed world has {dist.get_world_size()} ranks, topology {topo.world_size}"
        )
    groups = {}
    for n in range(topo.nodes):
        ranks = topo.node_ranks(n)
        groups[("intra", n)] = (dist.new_group(ranks), ranks)
        groups[("overlap", n)] = (dist.new_group(ranks), ranks)
    for i in nic_ids:
        ranks = topo.nic_ranks(i)
        groups[("inter", i)] = (dist.new_group(ranks), ranks)
    return Communicators(
        topo=topo,
        world=TorchComm(None, list(range(topo.world_size))),
        intra=TorchComm(*groups[("intra", node)]),
        intra_overlap=TorchComm(*groups[("overlap", node)]),
        inter=TorchComm(*groups[("inter", nic)]),
    )
