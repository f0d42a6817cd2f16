"""Local queues with RabbitMQ's TTL semantics: the catalog of queues, topics and policies, and the
queue rules applied inside one store transaction (``txn.py``). May import ``model`` and the
SQLite store's row codec; never ``server`` or ``dispatch``."""
