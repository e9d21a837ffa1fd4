"""The test-only native harness (csrc/testing/), built here by build.py."""
