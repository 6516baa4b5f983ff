"""Integrations with the frameworks and tools around wurk, each an optional extra.

Nothing here is imported by ``import wurk``: each module imports its own
third-party package and, when that is missing, raises an ImportError naming
the extra that installs it.
"""
