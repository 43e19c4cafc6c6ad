"""The Ray engine on a real local cluster (2 CPUs) gives the local engine's vectors; BEIR metrics by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evaluation.beir import mrr_at, ndcg_at, paired_difference, recall_at, score_run
from index.build.builder import BuildOptions, build_from_input
from index.search_index import SearchIndex
from index.storage.store import DocumentStore
from tests.index.conftest import tiny_documents, write_jsonl


def stored_vectors(root: Path) -> dict[int, np.ndarray]:
    store = DocumentStore(root / "versions" / "1" / "store.sqlite", create=False)
    try:
        return {int(i): v for ids, m in store.iter_vectors() for i, v in zip(ids, m, strict=True)}
    finally:
        store.close()


@pytest.mark.slow  # whole-model exports, Ray, subprocess kills or real data: make test, not test-fast
def test_ray_engine_matches_local(tmp_path: Path, tiny_encoder) -> None:
    import ray

    corpus = write_jsonl(tmp_path / "c.jsonl", tiny_documents(120, seed=5))
    local = build_from_input(tmp_path / "local", corpus, tiny_encoder, BuildOptions(show_progress=False))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        options = BuildOptions(engine="ray", show_progress=False, ray_actors=1)
        distributed = build_from_input(tmp_path / "ray", corpus, tiny_encoder, options)
    finally:
        ray.shutdown()
    assert distributed["chunks"] == local["chunks"] == 120 and distributed["checksum"] == local["checksum"]
    a, b = stored_vectors(tmp_path / "local"), stored_vectors(tmp_path / "ray")
    assert a.keys() == b.keys()
    np.testing.assert_allclose(np.stack(list(a.values())), np.stack([b[k] for k in a]), atol=1e-5)
    assert not (tmp_path / "ray" / "versions" / "1" / "ray").exists()  # shards merged and cleaned
    index = SearchIndex.open(tmp_path / "ray", tiny_encoder, create=False)
    text = tiny_documents(120, seed=5)[42]["text"]
    assert index.search(tiny_encoder.embed([text], normalize=True)[0], text, top_k=1)[0].id == "d42"
    index.close()


def test_metrics_match_hand_computed_values() -> None:
    relevant = {"a": 1, "c": 2, "z": 0}
    ranked = ["b", "a", "c"]
    dcg = 1 / np.log2(3) + 2 / np.log2(4)
    idcg = 2 / np.log2(2) + 1 / np.log2(3)
    assert ndcg_at(ranked, relevant, 10) == pytest.approx(dcg / idcg)
    assert mrr_at(ranked, relevant, 10) == 0.5 and mrr_at(ranked, relevant, 1) == 0.0
    assert recall_at(ranked, relevant, 2) == 0.5 and recall_at(ranked, relevant, 100) == 1.0
    scores = score_run({"q1": ranked, "q2": ["x"]}, {"q1": relevant, "q2": {"y": 1}})
    assert scores["mrr@10"] == pytest.approx(0.25) and scores["recall@100"] == pytest.approx(0.5)


def test_paired_difference_counts_queries_and_brackets_the_mean() -> None:
    baseline = np.array([0.5, 0.5, 0.5, 0.5])
    paired = paired_difference(np.array([0.6, 0.7, 0.5, 0.4]), baseline)
    assert paired["ndcg@10"] == pytest.approx(0.05) and (paired["better"], paired["worse"]) == (2, 1)
    assert paired["ci95"][0] <= 0.05 <= paired["ci95"][1]
    assert paired_difference(baseline, baseline) == {
        "ndcg@10": 0.0,
        "ci95": [0.0, 0.0],
        "better": 0,
        "worse": 0,
    }
