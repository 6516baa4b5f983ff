"""Instruments the runtime and the pushers call: metrics and profiles."""
