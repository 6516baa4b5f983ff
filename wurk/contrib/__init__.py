"""Integrations with frameworks and tools, each an optional extra.

``import wurk`` never imports anything here.
"""
