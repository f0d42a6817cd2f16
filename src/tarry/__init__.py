"""tarry: durable delayed-message delivery."""

__version__ = "0.1.0"
