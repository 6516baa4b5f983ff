"""A port where a TCP socket listens and nothing speaks Redis: proof that a test used none.

``listening()`` gives its ``redis://`` URL; ``untouched(listener)`` is True
while no client has tried to connect (a connection attempt, even one a
client gave up on, stays in the listen backlog to be found).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def listening() -> Iterator[tuple[str, socket.socket]]:
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}", listener
    finally:
        listener.close()


def untouched(listener: socket.socket) -> bool:
    try:
        accepted, _ = listener.accept()
    except BlockingIOError:
        return True
    accepted.close()
    return False
