"""Text in: documents split into token windows (``chunking``), words into search terms (``analysis``)."""
