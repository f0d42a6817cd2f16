"""Adapters to the outside world. May import ``model``, ``errors`` and ``config``; each wraps its
library's errors into ``DeliveryFailed`` at this boundary only."""
