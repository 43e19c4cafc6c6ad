"""The FastAPI service: routes, schemas, auth, limits, metrics. ``create_app`` builds it."""
