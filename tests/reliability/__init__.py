"""Reliability tests: processes killed mid-write, files changed under readers."""
