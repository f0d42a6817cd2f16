"""The pure core: message model, states, time, and every send-time rule.

Owns: the semantics taken from the five systems (TTL precedence, delay limits, state
transitions, policies, death records). May import only ``tarry.errors`` (and numpy); no I/O,
no threads, no asyncio. The send rules are tables (``rules.py``) applied to one send
(``validate.py``) or column-wise to an Arrow batch (``columns.py``, the one module that needs
pyarrow, from the ``spark`` extra; the server never imports it).
"""
