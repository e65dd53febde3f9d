"""Load balancing and expert migration: what to do when routing is skewed.

Balancers (FEPLB Sec. 2 and its baselines): ``feplb`` (static/dynamic experts, greedy
per-micro-batch balancer), ``fastermoe_shadow`` (FasterMoE's shadow experts), ``least_loaded_ep``
(MoP Sec. 3.3), ``eplb_replication`` (DeepSeek EPLB-style replica plans, global or hierarchical,
and their inter-node dispatch bytes). Migration (Piper Sec. VI-A): ``expert_migration`` (Alg. 2
hill climbing, real weight moves), ``migration_cost`` (Table IV), ``expert_copy`` (shipping
experts between ranks). Inputs and metrics:
``routing_trace`` (traces, straggler metrics), ``routing_record`` (real traces from a CPU run),
``load_balance_eval`` (replaying a trace through the balancers).

The registry. Every balancing method implements one interface, :class:`.base.Balancer`: given
one micro-batch's per-expert counts (and the previous micro-batch's, for methods that plan from
history), the home placement and its knobs, it returns the rows and expert GEMM groups of each
device. Placement-changing methods (EPLB replication, Piper's hill-climbing migration) fit the
same interface: their plan for a micro-batch is the placement they chose from history, applied
to the actual counts (base.py says what that leaves out). Each method's module registers it
once; this package holds the one registry (registry.py), in the order shown by :func:`balancer_names`:
"Before LB" (base.py), "FasterMoE", "FEPLB", "LLEP", "EPLB", "Piper migration".
:func:`get_balancer` looks one up by the name users see; load_balance_eval replays every
registered balancer.

Adding a balancer:
1. in its own module of this package, write ``plan(step: BalanceStep, knobs: dict) ->
   DeviceWork`` and register it once at the bottom of the module:
   ``register_balancer(Balancer(name=..., paper=..., description=..., needs_history=...,
   knobs={knob: default}, plan=plan))`` (``register_balancer`` from ``.registry``);
2. import that module at the bottom of this file, after the others.
tests/test_balance_registry.py then checks it keeps every row and returns one entry per device.
"""

from __future__ import annotations

# The registry itself lives in registry.py, which the balancers' modules import (importing this
# package from them would close an import cycle: tests/test_layers.py).
from moe_repro.components.balance.registry import (
    BALANCERS,
    balancer_names,
    check_knobs,
    get_balancer,
    register_balancer,
)

__all__ = ["BALANCERS", "balancer_names", "check_knobs", "get_balancer", "register_balancer"]

# Each module registers its balancer when imported (after the functions above exist).
from moe_repro.components.balance import fastermoe_shadow  # noqa: E402,F401
from moe_repro.components.balance import feplb  # noqa: E402,F401
from moe_repro.components.balance import least_loaded_ep  # noqa: E402,F401
from moe_repro.components.balance import eplb_replication  # noqa: E402,F401
from moe_repro.components.balance import expert_migration  # noqa: E402,F401
