"""Durable delayed-message storage behind the ``DelayedStore`` contract (``store/base.py``).

Owns: keeping scheduled messages, claiming due ones, failure counts. May import ``model`` and
``errors``; never ``server``, ``dispatch`` or ``transports``.
"""
