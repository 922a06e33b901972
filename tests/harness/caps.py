"""Run as a user without root's power over files, as a test harness can: drop CAP_DAC_OVERRIDE and
CAP_DAC_READ_SEARCH (what lets root write a file of mode 0444 or another user's), like
`setpriv --bounding-set -dac_override,-dac_read_search`, but in a process forked from the fork server.

    python -c "$UNPRIVILEGED_TRAIN" fit     # python -m train fit, unprivileged

CI runs the tests as root; a developer's own UID has no such capability, and dropping it is then a no-op.
"""

from __future__ import annotations

import ctypes
import os

CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2
_CAP_SETPCAP = 8  # needed to drop from the bounding set
_PR_CAPBSET_DROP = 24
_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def can_drop_file_override() -> bool:
    """Whether `drop_file_override` can work here: not root, or root holding CAP_SETPCAP (a container may not)."""
    if os.geteuid() != 0:
        return True
    with open("/proc/self/status") as status:
        effective = next(int(line.split()[1], 16) for line in status if line.startswith("CapEff:"))
    return bool(effective & (1 << _CAP_SETPCAP))


def drop_file_override() -> None:
    """From now on this process and what it starts (exec included) obey files' modes and owners. Raises OSError."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):  # the bounding set: an exec'd root process regains none
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    header, data = _Header(_VERSION_3, 0), (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    keep = ~((1 << CAP_DAC_OVERRIDE) | (1 << CAP_DAC_READ_SEARCH)) & 0xFFFFFFFF
    data[0].effective &= keep
    data[0].permitted &= keep
    data[0].inheritable &= keep
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


# `python -m train ARGS`, run as `python -c UNPRIVILEGED_TRAIN ARGS` (run_python and start_python take it).
UNPRIVILEGED_TRAIN = (
    "import runpy, sys\n"
    "from tests.harness.caps import drop_file_override\n"
    "drop_file_override()\n"
    "sys.argv[0] = 'train'\n"
    "runpy.run_module('train', run_name='__main__', alter_sys=True)\n"
)
