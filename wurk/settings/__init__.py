"""Settings: the Config object, where values come from, and their checks."""
