"""Shapes shared by the micro benchmarks."""

# X-MoE's DeepSeek-like dispatch shape (issue 6: H=2048, E=64, k=6, 4096 tokens), tokens and
# hidden divided by 4 so one round stays in milliseconds on a 2-core CPU.
TOKENS, HIDDEN, EXPERTS, TOP_K = 1024, 512, 64, 6
