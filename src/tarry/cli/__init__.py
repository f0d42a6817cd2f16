"""The ``tarry`` command line (click + rich). Talks to the server through ``tarry.client``; imports
``tarry.server.app`` only for ``serve``. Validates nothing but argument syntax."""
