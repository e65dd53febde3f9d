"""Load balancing and expert migration: what to do when routing is skewed.

Balancers (FEPLB Sec. 2 and its baselines): ``feplb`` (static/dynamic experts, greedy
per-micro-batch balancer), ``fastermoe_shadow`` (FasterMoE's shadow experts), ``least_loaded_ep``
(MoP Sec. 3.3), ``eplb_placement`` (DeepSeek EPLB-style replication). Migration (Piper Sec.
VI-A): ``expert_migration`` (Alg. 2 hill climbing, real weight moves), ``migration_cost``
(Table IV), ``expert_copy`` (shipping experts between ranks). Inputs and metrics:
``routing_trace`` (traces, straggler metrics), ``routing_record`` (real traces from a CPU run),
``load_balance_eval`` (replaying a trace through the balancers).
"""
