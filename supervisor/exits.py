"""How a swarm child exits: the statuses the child sets and the parent reads.

docs/reference/signals-and-exit-codes.md lists them with the other
programs' statuses; a test compares that table with these constants.
"""

EX_OK = 0
# The slot cannot boot (its modules fail to import, Redis refuses our
# credentials): EX_UNAVAILABLE. An unreachable Redis is waited for instead.
# Not 3: gunicorn's master halts when any child it reaps exits with 3.
EX_BOOT = 69
EX_CRASH = 70        # an unexpected error after boot
