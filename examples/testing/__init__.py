"""Tests written with wurk's testing mode (docs/how-to/testing.md): ``pytest examples/testing``."""
