"""The pure core: message model, states, time, and every send-time rule.

Owns: the semantics taken from the five systems (TTL precedence, delay limits, state
transitions, policies, death records). May import only ``tarry.errors``; no I/O, no threads,
no asyncio.
"""
