"""Foundations every layer uses: structured logging, redaction of secrets,
the thread supervisor, pid checks.
"""
