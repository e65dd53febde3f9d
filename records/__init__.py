"""Records: the typed result record every command stores, the store, and what travels with a record.

``record`` (the schema, its version and its migrations), ``store`` (one JSON file per run,
written atomically by ``atomic``), ``environment`` (provenance: commit, machine, command),
``stats`` (medians, spread, significance) and ``gate`` (the regression check over records).
Every layer may use this package; it uses none of them. (Named ``records``, not ``results``:
``./results`` is where the store keeps its files by default.)
"""
