"""``wurk-swarm --topology config.toml``: not built yet (see the swarm issue)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    print("wurk-swarm: the swarm supervisor is not built yet; use `wurk run`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
