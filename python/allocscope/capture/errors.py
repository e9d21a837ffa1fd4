"""Why a capture file cannot be read (allocscope.load raises these; the
CLI prints them as one line)."""

from __future__ import annotations

from ..common.errors import InputError

__all__ = ["CaptureError", "CorruptCaptureError", "NotACaptureError", "TruncatedCaptureWarning",
           "UnsupportedVersionError"]


class CaptureError(InputError):
    """A capture file cannot be read."""


class NotACaptureError(CaptureError):
    """The file is not an allocscope capture."""


class UnsupportedVersionError(CaptureError):
    """The file's format version is not one this allocscope reads."""


class CorruptCaptureError(CaptureError):
    """The file is damaged (a checksum or structure check failed)."""


class TruncatedCaptureWarning(UserWarning):
    """The file ends early; its valid prefix was loaded."""
