"""cloze-search: the service (``app.service``) and the FastAPI-free inference runtime (``app.runtime``)."""
