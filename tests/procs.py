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


def live_processes_with_env(tag: str) -> list[int]:
    """Live processes (not zombies) whose environment carries ``tag``."""
    found = []
    for pid in processes_with_env(tag):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
        except (OSError, IndexError):
            continue
        found.append(pid)
    return found


def none_left_with_env(tag: str, within_s: float) -> bool:
    """Whether every process tagged ``tag`` is gone within ``within_s`` (a hang guard: a busy
    machine takes a moment to end killed processes)."""
    import time

    deadline = time.monotonic() + within_s
    while processes_with_env(tag):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
