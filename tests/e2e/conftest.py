"""Fixtures of the end-to-end tests: real webhook receivers on loopback ports (receiver.py)."""

from tests.e2e.receiver import other, receiver

__all__ = ["other", "receiver"]
