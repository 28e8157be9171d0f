"""The package version, defined once (setup.cfg reads it)."""

__version__ = "0.2.0.dev0"
