"""cloze-search's service: the FastAPI app (``app.service``), its settings and the ``cloze`` CLI root."""
