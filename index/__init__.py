"""Indexing worker: documents -> chunks -> embeddings -> FAISS + SQLite (FTS5) + manifest."""
