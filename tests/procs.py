"""Find processes by an environment tag (to prove nothing is left behind)."""

from pathlib import Path


def processes_with_env(tag: str) -> list[int]:
    found = []
    needle = tag.encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found
