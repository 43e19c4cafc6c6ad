"""Backups: a snapshot is one tar archive of a version (``snapshots``); a restore checks the archive
(``checks``) before anything is written, then imports its rows into a store of its own (``importer``,
``restore``)."""
