"""Which tests are ``heavy``: left out of the README's quick test command
(``python -m pytest -q -m "not heavy" --durations=15``) and run by CI (.ci/run) right after it
(``-m heavy``), so every test still runs in CI, once.

conftest.py marks them at collection (pytest_collection_modifyitems), from this one list rather
than a decorator in each file. A test is heavy when it

- is marked ``multiprocess`` or ``slow`` (real ranks started, or seconds of work by its own
  account);
- is in a module listed in MODULES (the whole file waits on real processes, a browser, or
  reproductions at their defaults); or
- is a function listed in TESTS (every parametrization of it): single tests that took tens of
  seconds in a ``--durations`` report on the 2-core machine.

To move a test, edit this file: test_test_command.py checks that every name here still exists
(a renamed test would otherwise slip back into the quick set unnoticed).
"""

from __future__ import annotations

MARKERS = ("multiprocess", "slow")

# module file name -> why the whole file is heavy
MODULES: dict[str, str] = {
    "test_site_browser.py": "headless Chromium over a built site",
    "test_one_policy.py": "every analytic, sampled and simulated reproduction at its defaults",
    "test_feplb_seeds.py": "feplb-table3 and -table4 at two disjoint seed sets",
    "test_peer_equivalence.py": "Megatron-core and DeepSpeed layers beside ours on real ranks",
    "test_trainer.py": "PP x EP training worlds of real ranks",
    "test_supervision.py": "real rank worlds stopped, hung and killed",
    "test_launcher.py": "real rank worlds under the launcher",
    "test_launcher_exit.py": "real rank worlds and their exit codes",
    "test_launched_round3.py": "worlds under mpiexec and torchrun",
    "test_cleanup_round3.py": "the fault harness: signals at random moments of real worlds",
    "test_signal_moments.py": "signals at every start-up moment of real runs",
    "test_triton_kernels.py": "the Triton kernels in an interpreter-mode child",
    "test_doctor.py": "repro doctor's CPU half: real benchmarks",
}

# test module file name -> functions in it (all their parametrizations), each heavy
TESTS: dict[str, tuple[str, ...]] = {
    "test_flow_engine.py": (
        "test_rbd_default_point_matches_the_reference_on_16_nodes",
        "test_rbd_default_point_matches_the_reference_on_9_nodes",
    ),
    "test_bench_alltoall_anywhere.py": (
        "test_auto_backend_says_what_it_picked",
        "test_dispatch_and_bare_collective_side_by_side",
        "test_under_mpiexec_the_defaults_come_from_the_launched_world",
    ),
    "test_alltoall.py": (
        "test_piper_fig5_local_part_sweeps_sizes_and_reports_busbw",
        "test_xmoe_fig12_breakdown_runs_on_real_ranks",
    ),
    "test_bad_input.py": ("test_cuda_without_a_gpu_is_refused_before_any_rank_starts",),
    "test_balance_repros.py": ("test_piper_fig9_and_alg2_tiny_run",),
    # every README and --help example in turn: some 45 CLI runs, a 4-rank train among them
    "test_readme_examples.py": ("test_examples_run",),
}


def is_heavy(module: str, function: str, markers: set[str]) -> bool:
    """``module``: the test file's name; ``function``: the test function's name (without its
    parameters); ``markers``: the names of the marks it carries."""
    return bool(markers & set(MARKERS)) or module in MODULES or function in TESTS.get(module, ())
