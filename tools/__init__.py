"""Developer tools run from a checkout (``python -m tools.<name>``): never shipped, never imported by the
product or the client (import-linter's contracts in pyproject.toml)."""
