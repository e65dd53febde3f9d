"""components.lazy_import: a stand-in that imports on first use, then gets out of the way."""

from __future__ import annotations

import subprocess
import sys

from moe_repro.components.lazy_import import LazyModule, lazy_module


def test_already_imported_modules_are_returned_as_they_are():
    import json

    assert lazy_module("json", {}) is json


def test_first_use_imports_and_rebinds_the_name():
    namespace: dict = {}
    # a module nobody in this test process needs: imported only when read
    name = "xml.dom.minidom"
    was_loaded = name in sys.modules
    stand_in = lazy_module(name, namespace, "minidom")
    namespace["minidom"] = stand_in
    if not was_loaded:
        assert isinstance(stand_in, LazyModule) and name not in sys.modules
        assert "not imported yet" in repr(stand_in)
    parse = stand_in.parseString  # first read
    assert parse("<a/>").documentElement.tagName == "a"
    assert namespace["minidom"] is sys.modules[name]  # later reads skip the stand-in


def test_the_alltoall_registry_loads_without_torch():
    code = (
        "import sys; from moe_repro.components.alltoall import algorithm_names; "
        "import moe_repro.suites.alltoall; "
        "print(algorithm_names(), 'torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['flat', 'halo', 'rbd'] False"


def test_an_unknown_reproduction_id_is_refused_before_torch_is_imported():
    # `repro run` checks ids against the catalog: a typo costs no torch import (issue 31)
    code = (
        "import sys\nfrom moe_repro.cli import main\nsys.argv = ['repro', 'run', 'piper-tabel4']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    print(e.code, 'torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "2 False", r.stdout + r.stderr
    assert "did you mean piper-table4" in r.stderr
