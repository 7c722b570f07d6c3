"""A kernel counter file (procfs, sysfs) kept open and read again from its
start at each reading.

Reading `/proc/stat` with `Path.read_text()` opens the file, wraps it in a
text decoder, decodes all of it (every CPU's line and the interrupt counts)
and closes it, 100 times a second on the sampler thread while the gateway
is quiet; a kept descriptor and one `pread` of the first bytes costs a
third of that (43 -> 12.5 us of CPU a read on a 2-core VM: `python -m
bench.kernel_reads`). The kernel regenerates the file for each read either
way.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


class KernelFile:
    """One file's first `head_bytes`, read at each call. The descriptor is
    opened on the first read and again after a failed one (a driver reloaded);
    `close` lets it go. Safe across threads (`pread` keeps no offset)."""

    def __init__(self, path: Path, head_bytes: int = 4096) -> None:
        self.path = path
        self._head_bytes = head_bytes
        self._fd: int | None = None
        self._lock = threading.Lock()  # opening and closing only

    def head(self) -> bytes:
        """The file's first bytes as they are now; OSError as the system raises it."""
        fd = self._fd
        if fd is None:
            with self._lock:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                fd = self._fd
        try:
            return os.pread(fd, self._head_bytes, 0)
        except OSError:
            self.close()  # opened afresh by the next read
            raise

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
