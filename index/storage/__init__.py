"""One index folder (``layout``) and an opened version of it (``version``): the SQLite store, the source of
truth; FAISS (``vectors``, ``factories``), BM25 (``lexical``) and the filter columns (``columns``, ``filters``)
kept beside it; the changelog that brings every write to them (``changelog``, ``locks``)."""
