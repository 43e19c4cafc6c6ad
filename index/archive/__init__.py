"""Backups: a snapshot is one tar archive of a version (``snapshots``); a restore checks everything
(``checks``, ``faiss_file``) before anything is written (``restore``)."""
