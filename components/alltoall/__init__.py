"""The all-to-all family: how MoE dispatch moves token rows between expert-parallel ranks.

One module per algorithm, each implementing :class:`.base.AllToAll` (dispatch, combine, the
expected schedule the network simulator replays, and the bytes it puts on each link class):

- ``flat``: every rank exchanges rows directly with every other (the all-to-all-v baseline).
- ``halo``: Piper's hierarchical HALO all-to-all (Piper Sec. V, Alg. 1); ``halo_group`` runs it
  differentiably on any EP sub-group.
- ``rbd``: X-MoE's redundancy-bypassing dispatch (X-MoE Sec. 4.2, Fig. 7).
"""
