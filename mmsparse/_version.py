"""The package version (core: every output records it)."""

__version__ = "0.2.0"
