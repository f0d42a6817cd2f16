"""The HTTP API of api.md (FastAPI on uvicorn): translation only, no business rules. The
composition root (``app.py``) may import everything; routes call only the engine's contract."""
