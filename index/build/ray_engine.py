"""``--engine ray``: the embedding stage on Ray Data, for corpora that deserve more than one machine.

The driver exports the chunks still missing a vector to Parquet shards; Ray Data reads them and runs
``map_batches`` over a pool of encoder actors (each loads the model once; one GPU each when the cluster
has GPUs); the embedded shards are written back as Parquet and merged into the version's SQLite store.
From there the build continues exactly as a local one (same FAISS stage, same format), and a resumed
build only re-sends what was not merged yet. Connects to ``RAY_ADDRESS`` when set, else starts a local
cluster.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from encoder_runtime import load_encoder
from index.storage.store import DocumentStore

log = logging.getLogger(__name__)
SHARD_ROWS = 8192


class ChunkEmbedder:
    """A Ray actor: one encoder per actor, reused for every batch it is given."""

    def __init__(self, model: str, backend: str):

        self.encoder = load_encoder(model, backend=backend)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        vectors = self.encoder.embed([str(t) for t in batch["text"]], normalize=True)
        return {"id": batch["id"], "vector": np.array([v.tobytes() for v in vectors], dtype=object)}


def embed_pending_with_ray(store: DocumentStore, encoder: Any, options: Any) -> int:
    import ray

    work = store.path.parent / "ray"
    shutil.rmtree(work, ignore_errors=True)
    exported = _export_pending(store, work / "in")
    if not exported:
        return 0
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    cpus = int(ray.cluster_resources().get("CPU", 1))
    # Without GPUs each actor holds a CPU; leave one for the read / write tasks or the pipeline deadlocks.
    actors = options.ray_actors or (gpus or max(1, cpus // 2))
    actors = actors if gpus else min(actors, max(1, cpus - 1))
    dataset = ray.data.read_parquet(str(work / "in")).map_batches(
        ChunkEmbedder,
        fn_constructor_kwargs={"model": str(encoder.info.path), "backend": encoder.backend.name},
        batch_size=256,
        batch_format="numpy",
        concurrency=actors,
        num_gpus=1 if gpus else 0,
    )
    dataset.write_parquet(str(work / "out"))
    merged = _merge(store, work / "out")
    shutil.rmtree(work, ignore_errors=True)
    log.info("ray: %d chunks embedded by %d actor(s), %d GPU(s)", merged, actors, gpus)
    return merged


def _export_pending(store: DocumentStore, folder: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    after, total, shard = 0, 0, 0
    while True:
        ids, texts = store.pending_chunks(SHARD_ROWS, after)
        if not ids:
            return total
        pq.write_table(
            pa.table({"id": pa.array(ids, pa.int64()), "text": texts}), folder / f"{shard:06d}.parquet"
        )
        after, total, shard = ids[-1], total + len(ids), shard + 1


def _merge(store: DocumentStore, folder: Path) -> int:
    import pyarrow.parquet as pq

    merged = 0
    for shard in sorted(folder.glob("*.parquet")):
        table = pq.read_table(shard)
        ids = table.column("id").to_pylist()
        vectors = np.stack([np.frombuffer(b, dtype=np.float32) for b in table.column("vector").to_pylist()])
        with store.transaction() as conn:
            store.set_vectors(conn, ids, vectors)
        merged += len(ids)
    return merged
