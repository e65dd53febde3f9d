"""Where ranks sit and how bytes move between them: topology, platforms, network simulation.

``topology`` (ranks -> nodes -> switch groups -> racks, NIC affinity, emulated-node
communicators), ``platform`` (profiles of Frontier, DGX H100, H200 and this machine, in
``platforms/``), ``simulator`` (a flow-level simulator that replays the all-to-all family's
schedules, Piper Sec. V, X-MoE Sec. 4.2 and App. D), ``comm`` (the communicators every
all-to-all runs on), ``groups`` (an EP process group's topology and communicators, for HALO and
RBD), and ``rank_layout`` (EP-first vs DP-first rank layouts and their bytes per link class,
X-MoE App. C.1).
"""
