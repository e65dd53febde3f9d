"""The all-to-all family: how MoE dispatch moves token rows between expert-parallel ranks.

One module per algorithm, each implementing :class:`.base.AllToAll` (dispatch, combine, the
expected schedule the network simulator replays, and the bytes it puts on each link class):

- ``flat``: every rank exchanges rows directly with every other (the all-to-all-v baseline).
- ``halo``: Piper's hierarchical HALO all-to-all (Piper Sec. V, Alg. 1), on the world or any EP
  sub-group (the group's topology and communicators: network/groups.py, shared with RBD).
- ``rbd``: X-MoE's redundancy-bypassing dispatch (X-MoE Sec. 4.2, Fig. 7).

The registry: each module registers its algorithm once, on import (this package imports all of
them). ``get_algorithm(name)`` returns one (ValueError naming the known ones otherwise),
``algorithm_names(**facts)`` lists the names whose :class:`.base.AllToAllFacts` match, e.g.
``algorithm_names(schedule_from_counts=True)`` for the aggregated simulator. The MoE layer, the
trainer and ``repro train --alltoall``, the alltoall and dispatch-stages suites and the network
simulator all choose by name through it and ask the facts, never the name, what an algorithm
can do. Every algorithm's :class:`.base.Dispatcher` is differentiable when grad is enabled:
it is the one dispatch path, timed by the suites and trained with by the layer.

Adding an algorithm:
  1. a module here implementing :class:`.base.AllToAll` (facts, phase_dependencies, dispatcher,
     group_dispatcher, routed_schedule, and what its facts promise), ending with ``register(MyAlgorithm())``, and
     imported below;
  2. its exactness test against flat: tests/test_alltoall_registry.py already runs every
     registered algorithm's dispatch and combine against the loop reference on real ranks and
     compares what it sends with its schedule; add its own edge cases to tests/test_alltoall.py.
"""

from moe_repro.components.alltoall.base import (
    ALGORITHMS,
    AllToAll,
    AllToAllFacts,
    Dispatcher,
    algorithm_names,
    get_algorithm,
    register,
)
from moe_repro.components.alltoall import flat, halo, rbd  # noqa: F401  (they register)

__all__ = [
    "ALGORITHMS",
    "AllToAll",
    "AllToAllFacts",
    "Dispatcher",
    "algorithm_names",
    "get_algorithm",
    "register",
]
