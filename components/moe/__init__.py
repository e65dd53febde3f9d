"""The MoE layer, piece by piece (X-MoE Sec. 4.1 and Listing 1, App. A-B; Piper Sec. IV-A2).

Gating without a dense mask (``gating``), the padding-free token buffer (``pft``), the registry
of grouped-GEMM kernels (``grouped_gemm``), expert MLPs on them (``expert_mlp``), the
padding-free layer that chains them over an expert-parallel group (``moe_layer``), the
capacity-padded GShard/DeepSpeed layer it replaces (``padded_moe``), the sequence-sharded MoE
block (``ssmb``, X-MoE Sec. 4.3). The meter of the activation memory one layer saves for
backward (X-MoE Table 2) is components/training/activation_memory.py, beside the training
code it measures with.
"""
