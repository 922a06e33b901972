"""How much memory the host has left, and whether DATA_IN_MEMORY holds the splits in it. No TensorFlow here."""

from __future__ import annotations

from pathlib import Path

MEMORY_FRACTION = 0.5  # DATA_IN_MEMORY=auto holds the splits when their float32 arrays fit in this much
GIB = 1 << 30


def available_memory_bytes(root: Path = Path("/")) -> int | None:
    """Memory this process can still take: the least of MemAvailable and the cgroup's (container's) headroom.

    None where neither is known (not Linux). `root` lets a test hand it another /proc and /sys.
    """
    found = []
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (
        ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"),  # cgroup v2
        ("sys/fs/cgroup/memory/memory.limit_in_bytes", "sys/fs/cgroup/memory/memory.usage_in_bytes"),  # v1
    ):
        try:
            limit, usage = (root / limit_file).read_text().strip(), (root / usage_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and usage.isdigit() and int(limit) < 1 << 60:  # v1 says "no limit" with a huge number
            found.append(max(0, int(limit) - int(usage)))
    return min(found) if found else None


def hold_in_memory(setting: str, needed_bytes: int, available_bytes: int | None) -> tuple[bool, str | None]:
    """DATA_IN_MEMORY (auto, true, false) against the splits' float32 size: (in memory?, a note to say or None)."""
    if setting == "false":
        return False, "DATA_IN_MEMORY=false: streaming the splits from the prepared TFDS files."
    if available_bytes is None or needed_bytes <= MEMORY_FRACTION * available_bytes:
        return True, None
    size = f"{needed_bytes / GIB:.1f} GiB as float32, {available_bytes / GIB:.1f} GiB available"
    if setting == "true":
        return True, f"warning: DATA_IN_MEMORY=true holds the splits in memory although they may not fit ({size})."
    return False, (
        f"The splits need {size}: streaming them from the prepared TFDS files "
        "(DATA_IN_MEMORY=true holds them in memory anyway)."
    )
