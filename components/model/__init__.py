"""Models: the architecture zoo and the small transformer the trainer runs.

``zoo`` holds the architectures the reproductions are computed from (Piper Table I, X-MoE
Table 3, the M10B family, GLM-5's MoE layer, Piper Table IV's models); ``params`` counts their
total and active parameters. ``attention`` (Piper Sec. IV-A1), ``ulysses_attention`` (MoP Sec.
3.2), ``vocab_parallel_loss`` (MoP Sec. 3.4) and ``moe_transformer`` (nanoGPT style, cut into
pipeline stages, Piper Sec. III-A2a) are the model's building blocks.
"""
