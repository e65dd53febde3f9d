"""Training: Piper's PP x EP executor with 1F1B (Piper Sec. III, on
torch.distributed.pipelining), the host-resident optimizer (MoP Sec. 3.5), real text for
offline runs, peak-memory measurement, and the activation memory one MoE layer saves for
backward (``activation_memory``, X-MoE Table 2).
"""
