"""The package version, in one place (stores, archives and runs record it)."""

__version__ = "0.1.0"
"""The mmreplay version (stores, archives and runs record it)."""
