"""The parallel planner's search time (moved here from tests/: a wall time is a measurement of
the machine, reported as a median with spread, never asserted in a test).

- deepseek-v3 and gpt3-175b on 64 DGX-H100 nodes: the search `repro plan` runs;
- deepseek-v3 on 10^8 frontier nodes: candidates come from the divisors of the GPU count (up to
  its square root), not from every integer, so a huge cluster is answered like a small one.
"""

import pytest

from moe_repro.components.model.zoo import get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources.parallel_planner import plan_parallel


@pytest.mark.parametrize(
    "model, platform, nodes",
    [
        ("deepseek-v3", "dgx-h100", 64),
        ("gpt3-175b", "dgx-h100", 64),
        ("deepseek-v3", "frontier", 10**8),
    ],
)
def test_plan_parallel(benchmark, model, platform, nodes):
    spec, profile = get_model(model), load_builtin(platform)
    pl = benchmark.pedantic(
        plan_parallel, args=(spec, profile, nodes), rounds=5, iterations=1, warmup_rounds=1
    )
    # the output is a plan over the whole machine, not an early error
    assert pl.gpus == nodes * 8 and pl.candidates  # both platforms have 8 GPUs per node
