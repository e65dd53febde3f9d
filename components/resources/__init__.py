"""The resource model and planner (Piper Sec. III-IV, Eq. 1-12; MoP Table 1).

``memory_model`` (Piper Eq. 1-5 and a per-stage model), ``perf_model`` (FLOPs, all-to-all Eq. 6,
P2P, bubble, MFU Eq. 12) and ``planner`` (PP x EP search under Eq. 7-11).
"""
