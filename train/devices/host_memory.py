"""How much memory the host has left, and whether DATA_IN_MEMORY holds the splits in it. No TensorFlow here."""

from __future__ import annotations

from pathlib import Path

MEMORY_FRACTION = 0.5  # DATA_IN_MEMORY=auto holds the splits when what they cost takes at most this much
# What holding a split costs, against its bytes as stored: the array itself (TensorFlow shares it, no copy),
# plus the chunks it is read in and what the feed plans (measured: tests/test_memory.py keeps it under this).
PEAK_PER_BYTE = 1.5
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


def fits_in_memory(held_bytes: int, available_bytes: int | None, workers_here: int = 1) -> bool:
    """Whether the splits fit: their cost, for each worker this host runs, in MEMORY_FRACTION of what is left."""
    if available_bytes is None:
        return True
    return workers_here * PEAK_PER_BYTE * held_bytes <= MEMORY_FRACTION * available_bytes


def memory_note(
    setting: str, fits: bool, held_bytes: int, available_bytes: int | None, workers_here: int
) -> str | None:
    """What to say about DATA_IN_MEMORY's outcome: streaming, or holding splits that may not fit; else None."""
    if setting == "false":
        return "DATA_IN_MEMORY=false: streaming the splits from the prepared TFDS files."
    if fits or available_bytes is None:
        return None
    workers = f" x {workers_here} workers on this host" if workers_here > 1 else ""
    size = f"{held_bytes / GIB:.1f} GiB as stored{workers}, {available_bytes / GIB:.1f} GiB available"
    if setting == "true":
        return f"warning: DATA_IN_MEMORY=true holds the splits in memory although they may not fit ({size})."
    return (
        f"The splits need {size}: streaming them from the prepared TFDS files "
        "(DATA_IN_MEMORY=true holds them in memory anyway)."
    )
