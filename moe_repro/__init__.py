"""moe-repro: a reference harness for Mixture-of-Experts training systems.

The repository keeps the design's top-level folders (components/, suites/, reproductions/,
reports/); they install as ``moe_repro.components`` and so on. This package holds the harness
core that does file I/O and process management: the results store, the environment record, the
local multi-process launcher and the CLI.
"""

__version__ = "0.1.0"
