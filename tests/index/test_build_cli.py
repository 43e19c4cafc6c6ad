"""``cloze index build|add|delete`` as real processes, including SIGKILL mid-build and mid-publish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from index.search_index import SearchIndex
from index.storage import layout
from tests.index.conftest import tiny_documents, write_jsonl

REPO = Path(__file__).resolve().parents[2]


def cloze(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=REPO,
        env=os.environ | {"HF_HUB_OFFLINE": "1"} | (env or {}),
        capture_output=True,
        text=True,
        timeout=180,
    )


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> str:
    """In-process ``cloze`` (no interpreter start-up); returns its stdout."""
    from app.cli import main

    capsys.readouterr()
    main(list(args))
    return capsys.readouterr().out


def start_paused(args: list[str], stage: str, marker: Path) -> subprocess.Popen:
    """A build that stops at ``stage`` (see ``layout.pause_for_tests``) so the test can SIGKILL it there."""
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "CLOZE_INDEX_PAUSE_AT": stage,
        "CLOZE_INDEX_PAUSE_FILE": str(marker),
        "CLOZE_INDEX_PAUSE_SECONDS": "120",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", *args], cwd=REPO, env=env, stderr=subprocess.PIPE
    )
    deadline = time.time() + 120
    while not marker.exists():
        assert process.poll() is None, process.stderr.read().decode()[-2000:] if process.stderr else ""
        assert time.time() < deadline, "the build never reached the pause point"
        time.sleep(0.1)
    return process


def kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL


def build_args(corpus: Path, out: Path, model: Path, *extra: str) -> list[str]:
    return [
        "index",
        "build",
        "--input",
        str(corpus),
        "--out",
        str(out),
        "--model",
        str(model),
        "--backend",
        "torch",
        "--no-progress",
        *extra,
    ]


def test_build_add_delete_skip(tmp_path: Path, tiny_bert: Path, tiny_encoder, capsys) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", tiny_documents(30))
    out = tmp_path / "idx"
    summary = json.loads(run_cli(capsys, *build_args(corpus, out, tiny_bert)).strip().splitlines()[-1])
    assert summary["documents"] == 30 and summary["factory"] == "IDMap2,Flat"
    assert "nothing to do" in run_cli(capsys, *build_args(corpus, out, tiny_bert, "--skip-if-current"))
    assert layout.current_version(out) == 1
    extra = write_jsonl(
        tmp_path / "more.jsonl", [{"id": "x1", "text": "king queen"}, {"id": "d0", "text": "replaced"}]
    )
    added = run_cli(
        capsys,
        "index",
        "add",
        "--index",
        str(out),
        "--input",
        str(extra),
        "--model",
        str(tiny_bert),
        "--backend",
        "torch",
    )
    assert json.loads(added.splitlines()[-1])["documents"] == 31
    deleted = run_cli(
        capsys,
        "index",
        "delete",
        "--index",
        str(out),
        "--model",
        str(tiny_bert),
        "--backend",
        "torch",
        "d1",
        "nope",
    )
    assert json.loads(deleted.splitlines()[-1]) == {"deleted": ["d1"], "missing": ["nope"]}
    index = SearchIndex.open(out, tiny_encoder, create=False)
    assert index.stats() == {"documents": 30, "chunks": 30, "vectors": 30}
    assert index.get("d0").text == "replaced" and index.get("d1") is None
    index.close()


@pytest.mark.slow  # whole-model exports, Ray, subprocess kills or real data: make test, not test-fast
def test_sigkill_mid_publish_keeps_previous_version_and_resume_finishes(
    tmp_path: Path, tiny_bert: Path, tiny_encoder, capsys
) -> None:
    out = tmp_path / "idx"
    first = write_jsonl(tmp_path / "v1.jsonl", tiny_documents(20, seed=1))
    run_cli(capsys, *build_args(first, out, tiny_bert))
    second = write_jsonl(tmp_path / "v2.jsonl", tiny_documents(45, seed=2))
    process = start_paused(build_args(second, out, tiny_bert), "publish", tmp_path / "at-publish")
    kill(process)
    # The new version is complete on disk but was never published: readers still get version 1.
    assert layout.current_version(out) == 1 and (layout.version_dir(out, 2) / layout.MANIFEST).is_file()
    # A reader (a writable open would be the index's one writer, and the build would not publish past it).
    index = SearchIndex.open(out, tiny_encoder, create=False, read_only=True)
    assert index.stats()["documents"] == 20
    text = tiny_documents(20, seed=1)[3]["text"]
    assert (
        index.search(tiny_encoder.embed([text], normalize=True)[0], text, top_k=1, mode="hybrid")[0].id
        == "d3"
    )
    resumed = cloze(*build_args(second, out, tiny_bert, "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    assert layout.current_version(out) == 2
    assert index.reload_if_changed() is True and index.stats()["documents"] == 45
    index.close()


@pytest.mark.slow  # whole-model exports, Ray, subprocess kills or real data: make test, not test-fast
def test_sigkill_mid_ingest_then_resume(tmp_path: Path, tiny_bert: Path, tiny_encoder) -> None:
    out = tmp_path / "idx"
    corpus = write_jsonl(tmp_path / "big.jsonl", tiny_documents(1300, seed=3, words=6))
    process = start_paused(build_args(corpus, out, tiny_bert), "ingest", tmp_path / "at-ingest")
    kill(process)
    assert layout.current_version(out) is None
    with pytest.raises(FileNotFoundError):
        SearchIndex.open(out, tiny_encoder, create=False)
    resumed = cloze(*build_args(corpus, out, tiny_bert, "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    assert layout.all_versions(out) == [1]  # the interrupted version was continued, not restarted
    index = SearchIndex.open(out, tiny_encoder, create=False)
    assert index.stats() == {"documents": 1300, "chunks": 1300, "vectors": 1300}
    index.close()


def test_a_rebuild_reproduces_the_build_options(tmp_path: Path, tiny_encoder) -> None:
    """A forced factory and a chosen overlap are recorded in the manifest and kept by a service rebuild;
    upserts chunk with the build's overlap too."""
    from index.build.builder import BuildOptions, build_from_input
    from index.records import Document

    corpus = write_jsonl(tmp_path / "corpus.jsonl", tiny_documents(60, words=90))
    options = BuildOptions(factory="IVF4,Flat", overlap=5, show_progress=False)
    built = build_from_input(tmp_path / "idx", corpus, tiny_encoder, options)
    assert built["factory"] == "IVF4,Flat"
    assert built["build"] == {"factory": "IVF4,Flat", "chunk_window": 62, "chunk_overlap": 5}
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        assert index.chunker.overlap == 5
        index.upsert([Document("new", " ".join(["cat dog mat"] * 60))])
        rebuilt = index.rebuild()
        assert rebuilt["version"] == built["version"] + 1
        assert rebuilt["factory"] == "IVF4,Flat"  # not the exact index the corpus size would choose
        assert rebuilt["build"] == built["build"]
        assert rebuilt["chunks"] == index.stats()["chunks"] == index.stats()["vectors"]
    finally:
        index.close()
