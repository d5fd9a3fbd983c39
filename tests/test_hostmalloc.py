"""ctensor.hostmalloc: glibc's mmap and trim thresholds fixed at import, unless the user
set them (or turned the tuning off), and nothing done where the C library is not glibc."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import ctensor.hostmalloc as h; print(h.tuned)"


def _tuned(**env) -> str:
    full = {k: v for k, v in os.environ.items()
            if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES",
                         "CTENSOR_MALLOC_TUNE")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True,
                         text=True, timeout=120, check=True)
    return out.stdout.strip()


def _glibc() -> bool:
    import ctypes
    try:
        ctypes.CDLL(None).gnu_get_libc_version
    except (OSError, AttributeError):
        return False
    return sys.platform.startswith("linux")


@pytest.mark.skipif(not _glibc(), reason="glibc only")
def test_tuned_on_import_unless_the_user_chose():
    assert _tuned() == "True"
    assert _tuned(CTENSOR_MALLOC_TUNE="0") == "False"
    assert _tuned(MALLOC_TRIM_THRESHOLD_="1048576") == "False"
    assert _tuned(GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536") == "False"


def test_the_flag_says_what_was_done():
    from ctensor import hostmalloc
    assert hostmalloc.tuned is hostmalloc.tune()  # (a second call changes nothing)
    assert hostmalloc.tuned == _glibc() or "CTENSOR_MALLOC_TUNE" in os.environ or \
        any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                      "GLIBC_TUNABLES"))
