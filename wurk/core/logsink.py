"""The line sink under an entry point's log: whole lines to fd 2, info lines batched.

A worker at info level writes two lines per job; one ``write`` system call
per line (and the GIL handoff around each) was a large share of a no-op
job's cost. Lines at info and debug level are kept in memory and written
in batches; everything louder is written at once.

Duties:
1. :meth:`LineSink.write`: append one rendered line. An urgent line
   (warning and louder) first flushes what is pending, then is written
   before the call returns: it survives the process dying right after, and
   order is kept. So are the first :data:`BURST` lines of every
   :data:`FLUSH_INTERVAL` while nothing is pending: a process that logs
   little (a test, a quiet worker) writes each line at once, as before.
   Past that, a line waits at most :data:`FLUSH_INTERVAL` (a flusher thread
   writes it) and never behind more than :data:`MAX_PENDING` bytes (the
   writing thread flushes then).
2. Lines stay whole and in order, and none is lost to an exception raised
   in the flushing thread (a job's JobTimeout): lines are appended under
   one lock, and written in chunks of whole lines of at most ``PIPE_BUF`` bytes (one line
   longer than that alone), under a second lock, so a pipe shared with
   other processes (a swarm's children share the parent's stderr) never
   carries half a line, as with one write per line.
3. :meth:`LineSink.flush`: write everything pending, at once. It runs at
   interpreter exit (``atexit``), and entry points that leave by
   ``os._exit`` call it (through :func:`wurk.core.logging.flush`). What a
   SIGKILL (or a crash that skips both) can lose is bounded: the info and
   debug lines of the last :data:`FLUSH_INTERVAL` seconds, at most
   :data:`MAX_PENDING` bytes.
4. Fork: a fork waits for both locks and flushes first, so the child starts
   with an empty buffer and free locks (a lock held by another thread at
   the fork would stay held forever in the child); the child starts its own
   flusher thread when it first needs one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import threading
import time
from collections.abc import Callable

FLUSH_INTERVAL = 0.1  # seconds a batched line may wait
BURST = 32  # lines per FLUSH_INTERVAL written at once before batching starts
MAX_PENDING = 64 * 1024  # bytes pending before the writing thread flushes itself
CHUNK = getattr(select, "PIPE_BUF", 4096)  # one write of at most this many bytes is atomic


def write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd``; an error (stderr closed) drops it silently:
    logging must never take the process down."""
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass


class LineSink:
    """Whole lines to one file descriptor, batched unless urgent."""

    def __init__(self, fd: int = 2, interval: float = FLUSH_INTERVAL,
                 max_pending: int = MAX_PENDING, burst: int = BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fd = fd
        self.interval = interval
        self.max_pending = max_pending
        self.burst = burst
        self._clock = clock
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()  # guards _pending and _size
        self._write_lock = threading.Lock()  # one writer at a time: order on the fd
        self._pending: list[bytes] = []
        self._size = 0
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        self._flusher_pid = 0
        self._window = -float("inf")  # when the current interval began
        self._in_window = 0  # lines logged since then

    def write(self, line: bytes, urgent: bool = False) -> None:
        """Append one line (ending in a newline); urgent lines are written now."""
        if urgent:
            with self._write_lock:
                self._write(self._take())
                self._write([line])
            return
        now = self._clock()
        with self._lock:
            if now - self._window >= self.interval:
                self._window, self._in_window = now, 0
            self._in_window += 1
            first = not self._pending
            self._pending.append(line)
            self._size += len(line)
            full = self._size >= self.max_pending
        if full or (first and self._in_window <= self.burst):
            # A few lines at a time go out at once: only a stream is batched.
            self.flush()
        elif first:
            self._ensure_flusher()
            self._wake.set()

    def flush(self) -> None:
        """Write every pending line now."""
        with self._write_lock:
            self._write(self._take())

    def pending(self) -> int:
        """Lines waiting to be written."""
        with self._lock:
            return len(self._pending)

    def _take(self) -> list[bytes]:
        with self._lock:
            lines, self._pending, self._size = self._pending, [], 0
        return lines

    def _write(self, lines: list[bytes]) -> None:
        """Whole lines in chunks of at most CHUNK bytes; the write lock is held.

        An exception raised in the middle (a job's JobTimeout lands in the
        thread that is flushing) puts the lines not yet written back in
        front of the pending ones: a chunk may then be written twice, but no
        line is lost.
        """
        unwritten = 0  # index of the first line not known to be written
        try:
            size = 0
            for i, line in enumerate(lines):
                if i > unwritten and size + len(line) > CHUNK:
                    self._put(b"".join(lines[unwritten:i]))
                    unwritten, size = i, 0
                size += len(line)
            if unwritten < len(lines):
                self._put(b"".join(lines[unwritten:]))
            unwritten = len(lines)
        finally:
            if unwritten < len(lines):
                self._give_back(lines[unwritten:])

    def _give_back(self, lines: list[bytes]) -> None:
        with self._lock:
            self._pending[:0] = lines
            self._size += sum(len(line) for line in lines)

    def _put(self, data: bytes) -> None:
        write_all(self.fd, data)

    def _ensure_flusher(self) -> None:
        if self._flusher is not None and self._flusher_pid == os.getpid():
            return
        with self._lock:
            if self._flusher is not None and self._flusher_pid == os.getpid():
                return
            # Not wurk.core.threads: that module logs through this one.
            self._flusher = threading.Thread(target=self._flush_loop, name="wurk-log-flush",
                                             daemon=True)
            self._flusher_pid = os.getpid()
            self._flusher.start()

    def _flush_loop(self) -> None:
        wake = self._wake
        while True:
            wake.wait()
            wake.clear()
            # Wait out the interval so a burst of lines goes in few writes.
            time.sleep(self.interval)
            # The flusher must outlive anything (write_all already swallows OSError).
            with contextlib.suppress(Exception):
                self.flush()

    def before_fork(self) -> None:
        self._write_lock.acquire()
        self._write(self._take())
        self._lock.acquire()

    def after_fork_in_parent(self) -> None:
        self._lock.release()
        self._write_lock.release()

    def after_fork_in_child(self) -> None:
        # The flusher thread did not come along; locks and buffer start fresh.
        self._reset()


SINK = LineSink()
atexit.register(SINK.flush)
os.register_at_fork(before=SINK.before_fork, after_in_parent=SINK.after_fork_in_parent,
                    after_in_child=SINK.after_fork_in_child)
