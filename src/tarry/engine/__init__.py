"""tarry's core: ``Engine`` composes the store, the local queues, the dispatcher and the
transports, and is what every edge (HTTP server, AMQP ingress, pipeline) calls. ``api.py`` is its
contract; ``types.py`` the values it returns."""
