"""Redis access: the apply-safety policy, connections, Sentinel and the process's pools."""
