"""Moving due messages to their destinations: the due-time loop (``dispatcher.py``), retry
back-off (``backoff.py``) and circuit breakers (``breaker.py``). May import ``store.base``,
``transports.base`` and ``model``."""
