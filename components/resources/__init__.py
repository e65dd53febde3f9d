"""The resource model and planners (Piper Sec. III-IV, Eq. 1-12; MoP Table 1).

``memory_model`` (Piper Eq. 1-5 and a per-stage model), ``perf_model`` (FLOPs, all-to-all Eq. 6,
P2P, bubble, MFU Eq. 12), ``planner`` (PP x EP search under Eq. 7-11), ``parallel_planner``
(DP x TP x PP x EP x CP search) and ``time_model``, the one time model both planners take their
seconds from (GEMM, attention, HBM-bound kernels, link transfers, the pipeline step).
"""
