"""Flat tables of stored results (pandas), for CSV / JSON Lines export and the site's raw links."""

from __future__ import annotations

import pandas as pd


def reproduction_frame(payload: dict) -> pd.DataFrame:
    env = payload.get("environment", {})
    rows = [{"id": payload["id"], **cell, "git_commit": env.get("git_commit"),
             "timestamp": env.get("timestamp")} for cell in payload["cells"]]
    return pd.DataFrame(rows)


def suite_frame(payload: dict) -> pd.DataFrame:
    env = payload.get("environment", {})
    rows = [{**{k: v for k, v in r.items() if k != "samples"}, "git_commit": env.get("git_commit"),
             "timestamp": env.get("timestamp"), "device": env.get("device")}
            for r in payload["records"]]
    return pd.DataFrame(rows)


def frame(payload: dict) -> pd.DataFrame:
    return reproduction_frame(payload) if "cells" in payload else suite_frame(payload)


def write(df: pd.DataFrame, fmt: str) -> str:
    """Serialise to text in ``fmt`` (csv or jsonl); the caller writes it atomically."""
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "jsonl":
        return df.to_json(orient="records", lines=True)
    raise ValueError(f"format must be csv or jsonl, got {fmt!r}")
