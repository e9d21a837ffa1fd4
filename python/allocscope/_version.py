"""The package version, in one place (the capture metadata and the HTML report carry it)."""

__version__ = "0.1.0"
