"""Collections on disk (``index.collections``) and ``cloze collection`` / ``cloze index --collection``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from index.collections import (
    CollectionError,
    CollectionInfo,
    clean_leftovers,
    create_collection,
    delete_collection,
    list_collections,
    read_info,
)
from index.search_index import SearchIndex
from index.storage import layout
from tests.index.conftest import tiny_documents, write_jsonl
from tests.index.test_build_cli import run_cli


def test_create_list_delete(tmp_path: Path, tiny_encoder):
    info = CollectionInfo("legal", "default", factory="HNSW16", chunk_window=16, chunk_overlap=4)
    folder = create_collection(tmp_path, info, tiny_encoder)
    assert read_info(folder) == info and [c.name for c in list_collections(tmp_path)] == ["legal"]
    index = SearchIndex.open(folder, tiny_encoder, create=False)
    try:
        build = index.manifest["build"]
        assert (build["factory"], build["chunk_window"], build["chunk_overlap"]) == ("HNSW16", 16, 4)
        assert index.chunker.window == 16 and index.chunker.overlap == 4  # upserts chunk as it was made
    finally:
        index.close()
    with pytest.raises(CollectionError) as taken:
        create_collection(tmp_path, info, tiny_encoder)
    assert taken.value.status == 409
    delete_collection(tmp_path, "legal")
    assert list_collections(tmp_path) == [] and not folder.exists()
    with pytest.raises(CollectionError) as gone:
        delete_collection(tmp_path, "legal")
    assert gone.value.status == 404


def test_an_ivf_factory_starts_exact_and_applies_at_builds(tmp_path: Path, tiny_encoder):
    folder = create_collection(tmp_path, CollectionInfo("big", "default", factory="IVF4,Flat"), tiny_encoder)
    manifest = layout.read_manifest(layout.version_dir(folder, 1))
    assert manifest["factory"] == "IDMap2,Flat" and manifest["build"]["factory"] == "IVF4,Flat"
    with pytest.raises(CollectionError) as bad:
        create_collection(tmp_path, CollectionInfo("bad", "default", factory="Nonsense12"), tiny_encoder)
    assert (bad.value.status, bad.value.field) == (422, "factory")


def test_staging_folders_and_strays_are_not_collections(tmp_path: Path, tiny_encoder):
    create_collection(tmp_path, CollectionInfo("kept", "default"), tiny_encoder)
    (tmp_path / ".creating-half-0000").mkdir()
    (tmp_path / ".deleting-old-0000").mkdir()
    (tmp_path / "stray").mkdir()  # a folder without collection.json: ignored, never deleted
    (tmp_path / "Bad Name").mkdir()
    assert [c.name for c in list_collections(tmp_path)] == ["kept"]
    assert sorted(clean_leftovers(tmp_path)) == [".creating-half-0000", ".deleting-old-0000"]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "Bad Name",
        "kept",
        "stray",
    ]


def test_the_cli_creates_builds_adds_shows_and_deletes(tmp_path: Path, tiny_bert, capsys):
    root, corpus = tmp_path / "root", tmp_path / "docs.jsonl"
    write_jsonl(corpus, tiny_documents(20))
    common = ["--root", str(root), "--model", str(tiny_bert), "--backend", "torch"]
    run_cli(capsys, "collection", "create", "notes", "--chunk-overlap", "2", *common)
    built = json.loads(
        run_cli(capsys, "index", "build", "--collection", "notes", "--input", str(corpus), *common)
    )
    assert built["documents"] == 20 and built["version"] == 2
    extra = tmp_path / "more.jsonl"
    write_jsonl(extra, [{"id": "extra", "text": "one more"}])
    run_cli(capsys, "index", "add", "--collection", "notes", "--input", str(extra), *common)
    shown = json.loads(run_cli(capsys, "collection", "show", "notes", "--root", str(root), "--json"))
    assert (shown["documents"], shown["chunk_overlap"], shown["model"]) == (21, 2, "default")
    assert shown["bytes_on_disk"] > 0
    listed = json.loads(run_cli(capsys, "collection", "list", "--root", str(root), "--json"))
    assert [entry["name"] for entry in listed["collections"]] == ["notes"]
    run_cli(capsys, "index", "delete", "--collection", "notes", "extra", *common)
    assert (
        json.loads(run_cli(capsys, "collection", "show", "notes", "--root", str(root), "--json"))["documents"]
        == 20
    )
    run_cli(capsys, "collection", "delete", "notes", "--root", str(root))
    assert list_collections(root) == []
    with pytest.raises(SystemExit, match="not a collection name"):
        run_cli(capsys, "collection", "create", "../up", *common)


@pytest.mark.parametrize(
    ("factory", "words"),
    [
        ("IVF2000000000,Flat", "IVF lists is 2000000000, outside 1..65536"),
        ("IVF4000000,Flat", "IVF lists is 4000000"),
        ("HNSW1000000", "HNSW M is 1000000"),
        ("HNSW2000000000", "HNSW M is 2000000000"),
        ("NSG64", "not one of the factories"),
        ("IVF4,PQ5", "must divide the dimension"),
        ("PCA16,Flat", "not one of the factories"),
    ],
)
def test_factories_outside_the_grammar_are_refused_naming_the_field(
    tmp_path: Path, tiny_encoder, factory, words
):
    with pytest.raises(CollectionError) as refused:
        create_collection(tmp_path, CollectionInfo("f", "default", factory=factory), tiny_encoder)
    assert (refused.value.status, refused.value.field) == (422, "factory") and words in str(refused.value)
    assert list_collections(tmp_path) == []


def test_factories_in_the_grammar_pass_a_probe_and_overlap_is_at_most_half_the_window(
    tmp_path: Path, tiny_encoder
):
    for name, factory in (("a", "HNSW32"), ("b", "IVF65536,Flat"), ("c", "IVF256,PQ8x8"), ("d", "Flat")):
        create_collection(tmp_path, CollectionInfo(name, "default", factory=factory), tiny_encoder)
    create_collection(
        tmp_path, CollectionInfo("half", "default", chunk_window=16, chunk_overlap=8), tiny_encoder
    )
    with pytest.raises(CollectionError) as refused:
        create_collection(
            tmp_path, CollectionInfo("e", "default", chunk_window=16, chunk_overlap=15), tiny_encoder
        )
    assert (refused.value.status, refused.value.field) == (422, "chunk_overlap")
    assert "outside 0..8" in str(refused.value)
