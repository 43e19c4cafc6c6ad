"""The columns saved beside FAISS and mapped at open: reopened from their files they must hold what a load from
the store holds, after writes, deletes and a crash before the next save (the changelog's replay), and damaged
or stale files must fall back to the store, repaired and logged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from index.records import Document
from index.search_index import SearchIndex
from index.storage import columns as columns_module
from index.storage.columns import FILES, POINTER, Columns
from index.storage.filters import parse_filter
from tests.index.conftest import killed, opened, saved_index, tiny_documents
from tests.index.test_filter_oracle import FIELDS

FILTERS: list[dict[str, Any]] = [
    {"color": "red"},
    {"rank": {"$gte": 5}},
    {"$or": [{"color": "blue"}, {"tags": "x"}]},
    {"tags": {"$exists": True}},
    {"$not": {"rank": {"$lt": 3}}},
]


def documents(count: int, prefix: str = "d", offset: int = 0) -> list[Document]:
    colors = ["red", "green", "blue"]
    texts = [record["text"] for record in tiny_documents(count, seed=sum(map(ord, prefix)))]
    return [
        Document(
            f"{prefix}{i}",
            texts[i],
            {"color": colors[i % 3], "rank": i + offset} | ({"tags": ["x", f"t{i}"]} if i % 2 else {}),
        )
        for i in range(count)
    ]


def state(columns: Columns) -> dict[str, Any]:
    """What the columns say, independent of row order within the arrays and of dictionary codes: per field,
    per live row, its sorted elements (kind, number, text); the live rows; the chunk map."""
    live = np.zeros(columns.size, bool)
    live[: columns.size] = columns.alive[: columns.size]
    fields = {}
    for name, column in columns.fields.items():
        rows, kind, num, code = column.elements(live)
        present = np.flatnonzero(column.present[: columns.size] & live)
        elements: dict[int, list] = {int(r): [] for r in present}
        for r, k, n, c in zip(rows, kind, num, code, strict=True):
            elements.setdefault(int(r), []).append(
                (int(k), None if np.isnan(n) else float(n), columns.texts[c] if c >= 0 else None)
            )
        fields[name] = {r: sorted(e, key=repr) for r, e in elements.items() if r in set(present.tolist())}
    mapped = np.flatnonzero(columns.chunk_row)
    return {
        "alive": np.flatnonzero(live).tolist(),
        "chunks": dict(zip(mapped.tolist(), columns.chunk_row[mapped].tolist(), strict=True)),
        "fields": {n: f for n, f in fields.items() if f},
    }


def assert_same_as_the_store(index: SearchIndex) -> None:
    live = index._live
    assert state(live.columns) == state(Columns.load(live.store))
    for node in FILTERS:
        tree = parse_filter(node)
        chosen = live.columns.select(tree).documents
        where, params = live.store.filter_sql(tree)
        by_sql = live.store.query(f"SELECT d.rid FROM documents d WHERE {where}", params).fetchall()
        assert set(np.flatnonzero(chosen).tolist()) == {rid for (rid,) in by_sql}


def counted(index: SearchIndex, node: dict[str, Any]) -> int:
    """Documents matching ``node`` as the columns count them (facets read the columns, listings SQL)."""
    return int(index.facets(node, [], top=1)["total"])


def is_mapped(columns: Columns) -> bool:
    return isinstance(columns.chunk_row.base, np.memmap) and isinstance(columns.alive.base, np.memmap)


def test_a_reopened_version_maps_its_columns_and_they_equal_a_load_from_the_store(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    monkeypatch.setattr(columns_module, "MAPPED_BYTES", 0)  # map every array, however small
    root = tmp_path / "idx"
    index = SearchIndex.open(root, tiny_encoder)
    index.upsert(documents(30))
    for i in (3, 4, 17):
        index.delete(f"d{i}")
    index.upsert(documents(5, offset=100))  # rewrites d0..d4: new rows, old ones dead, d3 and d4 back
    seq = index._live.store.max_seq()
    index.close()  # the snapshot saves FAISS and the columns

    loads: list[Any] = []
    real_load = Columns.load
    monkeypatch.setattr(
        Columns, "load", classmethod(lambda cls, store: loads.append(store) or real_load(store))
    )
    with opened(root, tiny_encoder) as reopened:
        monkeypatch.setattr(Columns, "load", real_load)
        assert loads == []  # nothing read from the store: no fetchall() of every chunk
        assert reopened._live.columns_seq == seq and is_mapped(reopened._live.columns)
        assert_same_as_the_store(reopened)
        # Writes land on the mapped arrays (copy-on-write), within the saved headroom and past it.
        reopened.upsert(documents(3, prefix="n"))
        reopened.delete("d5")
        reopened.upsert(documents(2000, prefix="bulk"))
        assert_same_as_the_store(reopened)
        assert counted(reopened, {"color": "red"}) == reopened.count_documents({"color": "red"})
    with opened(root, tiny_encoder) as again:
        assert is_mapped(again._live.columns)
        assert_same_as_the_store(again)
    saved = [p.name for p in (layout_folder(root) / FILES).iterdir()]
    assert saved == [json.loads((layout_folder(root) / POINTER).read_text())["folder"]]  # older saves dropped


def layout_folder(root: Path) -> Path:
    from index.storage import layout

    return layout.version_dir(root, layout.current_version(root))


def test_writes_after_the_last_save_are_replayed_onto_the_mapped_columns(
    tmp_path: Path, tiny_encoder
) -> None:
    root, repairs = tmp_path / "idx", []
    saved_index(root, tiny_encoder, documents(12))
    crashed = SearchIndex.open(root, tiny_encoder)
    crashed.upsert(documents(4, prefix="late", offset=50))
    crashed.delete("d2")
    crashed.upsert([Document("d7", "rewritten", {"color": "violet", "rank": -1})])
    saved_seq = json.loads((crashed._live.folder / POINTER).read_text())["synced_seq"]
    assert saved_seq < crashed._live.store.max_seq()
    killed(crashed)  # written, never saved

    with opened(root, tiny_encoder, on_repair=repairs.append) as reopened:
        assert repairs == []
        assert reopened._live.applied_seq == reopened._live.store.max_seq()
        assert_same_as_the_store(reopened)
        assert counted(reopened, {"color": "violet"}) == 1
        assert counted(reopened, {"color": {"$exists": True}}) == 15
        assert reopened.stats() == {"documents": 15, "chunks": 15, "vectors": 15}


def test_a_crash_between_the_faiss_save_and_the_columns_save_replays_from_the_older(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    root, repairs = tmp_path / "idx", []
    saved_index(root, tiny_encoder, documents(6))
    index = SearchIndex.open(root, tiny_encoder)
    index.upsert(documents(5, prefix="e"))
    index.delete("d1")

    def refused(self, folder: Path, seq: int) -> None:
        raise OSError("killed before the columns were saved")

    monkeypatch.setattr(Columns, "save", refused)
    index._live.snapshot()  # FAISS saved at the new point, the columns still at the old one
    monkeypatch.undo()
    live = index._live
    assert live.saved_seq == live.applied_seq > live.columns_seq
    assert live.store.pruned_through() <= live.columns_seq  # the changelog the columns need is kept
    killed(index)

    with opened(root, tiny_encoder, on_repair=repairs.append) as reopened:
        assert repairs == []
        assert_same_as_the_store(reopened)
        assert reopened.stats() == {"documents": 10, "chunks": 10, "vectors": 10}
        for document in documents(5, prefix="e"):
            top = reopened.search(tiny_encoder.embed([document.text], normalize=True)[0], "", top_k=1)
            assert top[0].id == document.id


def damage(folder: Path, how: str) -> None:
    saved = folder / FILES / json.loads((folder / POINTER).read_text())["folder"]
    if how == "truncate":
        target = saved / "chunk_row.npy"
        target.write_bytes(target.read_bytes()[:100])
    elif how == "delete-array":
        (saved / "0.kind.npy").unlink()
    elif how == "garble-pointer":
        (folder / POINTER).write_text("{not json")
    elif how == "wrong-type":
        np.save(saved / "alive.npy", np.zeros(len(np.load(saved / "alive.npy")), np.float32))
    elif how == "ahead":
        pointer = json.loads((folder / POINTER).read_text())
        (folder / POINTER).write_text(json.dumps(pointer | {"synced_seq": pointer["synced_seq"] + 1000}))
    elif how == "lost-rows":
        alive = np.load(saved / "alive.npy")
        alive[np.flatnonzero(alive)[:2]] = False
        np.save(saved / "alive.npy", alive)


def test_damaged_or_disagreeing_column_files_are_read_from_the_store_and_saved_again(
    tmp_path: Path, tiny_encoder
) -> None:
    root = tmp_path / "idx"
    folder = saved_index(root, tiny_encoder, documents(9))
    expected = {
        "truncate": "damaged-columns",
        "delete-array": "damaged-columns",
        "garble-pointer": "damaged-columns",
        "wrong-type": "damaged-columns",
        "ahead": "columns-ahead",
        "lost-rows": "columns-mismatch",
    }
    for how, reason in expected.items():
        damage(folder, how)
        repairs: list[str] = []
        with opened(root, tiny_encoder, on_repair=repairs.append) as reopened:
            assert repairs == [reason], how
            assert_same_as_the_store(reopened)
            assert counted(reopened, {"color": "red"}) == 3
        repairs.clear()
        with opened(root, tiny_encoder, on_repair=repairs.append) as again:
            assert repairs == [], how  # the repair was saved
            assert again._live.columns_seq == again._live.applied_seq


def test_a_version_without_column_files_loads_once_and_the_writer_saves_them(
    tmp_path: Path, tiny_encoder
) -> None:
    root = tmp_path / "idx"
    folder = saved_index(root, tiny_encoder, documents(7))
    (folder / POINTER).unlink()  # as a version written before the files existed
    shutil.rmtree(folder / FILES)
    with opened(root, tiny_encoder, read_only=True) as replica:
        assert replica._live.columns_seq == -1 and not (folder / POINTER).exists()  # a reader writes nothing
        assert_same_as_the_store(replica)
    repairs: list[str] = []
    with opened(root, tiny_encoder, on_repair=repairs.append) as writer:
        assert repairs == [] and (folder / POINTER).exists()
        assert writer._live.columns_seq == writer._live.applied_seq
    with opened(root, tiny_encoder, read_only=True) as reader:
        assert reader._live.columns_seq > 0
        assert_same_as_the_store(reader)


def test_field_names_survive_the_files(tmp_path: Path, tiny_encoder) -> None:
    """Every field of the oracle's metadata, and names with spaces, dots and accents, come back by name."""
    root = tmp_path / "idx"
    names = [*FIELDS, "with space", "dotted.name", "ünï"]
    saved_index(
        root, tiny_encoder, [Document(f"x{i}", "text", {name: i for name in names}) for i in range(3)]
    )
    with opened(root, tiny_encoder) as reopened:
        assert set(reopened._live.columns.fields) == set(names)
        assert counted(reopened, {"with space": {"$gte": 1}}) == 2
        assert_same_as_the_store(reopened)


def test_a_save_landing_between_the_pointer_and_its_files_is_read_again(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    """A replica reads ``columns.json``, the writer saves and drops the folder it named: read the pointer again."""
    root, repairs, tries = tmp_path / "idx", [], []
    saved_index(root, tiny_encoder, documents(5))
    real = Columns._mapped

    def replaced_meanwhile(cls, saved: Path, pointer: dict, texts: list[str] | None = None) -> Columns:
        tries.append(saved)
        if len(tries) == 1:
            raise FileNotFoundError(saved / "alive.npy")
        return real(saved, pointer, texts)

    monkeypatch.setattr(Columns, "_mapped", classmethod(replaced_meanwhile))
    with opened(root, tiny_encoder, read_only=True, on_repair=repairs.append) as replica:
        assert repairs == [] and len(tries) == 2 and replica._live.columns_seq > 0
        assert_same_as_the_store(replica)


def test_a_restore_and_a_rebuild_publish_versions_whose_columns_open_mapped(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    """Both make a new version from rows (a restore's import, a rebuild's re-embedding): its columns are saved
    with it, so neither the swap nor a replica's next open reads them from the store."""
    root = tmp_path / "idx"
    index = SearchIndex.open(root, tiny_encoder)
    try:
        index.upsert(documents(8))
        entry = index.snapshot(tmp_path / "snaps")
        index.upsert(documents(3, prefix="after"))
        loads: list[Any] = []
        real_load = Columns.load
        monkeypatch.setattr(
            Columns, "load", classmethod(lambda cls, store: loads.append(store) or real_load(store))
        )
        for make in (lambda: index.restore(tmp_path / "snaps" / entry["name"]), index.rebuild):
            before = index._live.number
            loads.clear()
            make()
            assert len(loads) == 1  # the new version's save read the store once; its open did not
            live = index._live
            assert live.number != before and (live.folder / POINTER).exists()
            assert live.columns_seq == live.applied_seq == live.store.max_seq()
            assert_same_as_the_store(index)
        assert counted(index, {"color": {"$exists": True}}) == 8
    finally:
        index.close()
