"""Crash cases against a real ``cloze serve``: SIGKILL at named points (``index.faultpoints``), second
writer processes, damaged files and a full disk, each followed by a restart and one checker.

The checker's bar: every acknowledged document answers ``GET`` with its text, is the top dense hit for
its own text and among the top 10 BM25 hits for it (tantivy's index, replayed from the changelog after the
kill), and the index holds as many vectors as chunks. Shared by ``tests/e2e/test_crashes.py`` (the
suite) and ``benchmarks/crash_matrix.py`` (the same cases with longer write streams).

The tiny random model serves (mechanics only): texts are distinct word sequences, so each is its own
nearest neighbour. The index lives on a small tmpfs so the full-disk cases can fill it (needs root).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness.servers import free_port
from harness.tiny_model import TINY_WORDS

REPO = Path(__file__).resolve().parents[1]
KEY = "crash-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
BM25_DEPTH = 1000  # the deepest search a request may ask for (offset + top_k)


def mount_tmpfs(folder: Path, megabytes: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the full-disk crash cases need a small tmpfs (run as root): mount said {done.stderr.strip()}"
        )


def unmount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log: Path
    marker: Path  # the pause point it waits at is written here; deleting it lets the process go on
    armed: Path  # pause points fire only while this exists

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@dataclass
class Chain:
    """One index, one model, a ledger of acknowledged documents, and the server of the moment."""

    root: Path
    model: Path
    work: Path
    acked: dict[str, str] = field(default_factory=dict)
    results: list[dict[str, Any]] = field(default_factory=list)
    server: Server | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(20))
    _texts: set[str] = field(default_factory=set)
    _serial: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def marker(self) -> Path:
        assert self.server is not None
        return self.server.marker

    def arm(self) -> None:
        """Pause points fire from now on (not during the restart's own replay and snapshot)."""
        assert self.server is not None
        self.server.armed.touch()

    # ---- processes ----------------------------------------------------------------------------------

    def env(self, extra: dict[str, str] | None = None, name: str = "cli") -> dict[str, str]:
        return {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "CLOZE_MODEL": str(self.model),
            "CLOZE_FILL_MASK_MODEL": str(self.model),
            "CLOZE_BACKEND": "torch",
            "CLOZE_INDEX": str(self.root),
            "CLOZE_API_KEYS": KEY,
            "CLOZE_MAX_TOP_K": str(BM25_DEPTH),  # the checker reads the whole BM25 list
            "CLOZE_LOG_LEVEL": "info",
            "CLOZE_INDEX_PAUSE_FILE": str(self.work / f"{name}.paused"),
            "CLOZE_INDEX_PAUSE_SECONDS": "120",
            "CLOZE_INDEX_PAUSE_ARMED_BY": str(self.work / f"{name}.armed"),
            **(extra or {}),
        }

    def spawn(self, name: str, extra: dict[str, str] | None = None, workers: int = 1) -> Server:
        port = free_port()
        log = self.work / f"{name}.log"
        command = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
        process = subprocess.Popen(
            [*command, "--workers", str(workers)],
            cwd=REPO,
            env=self.env(extra, name),
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        marker, armed = self.work / f"{name}.paused", self.work / f"{name}.armed"
        return Server(process, f"http://127.0.0.1:{port}", log, marker, armed)

    def start(self, name: str, extra: dict[str, str] | None = None) -> Server:
        self.server = self.spawn(name, extra)
        wait_ready(self.server)
        return self.server

    def kill(self) -> None:
        assert self.server is not None
        self.server.kill()
        self.server = None

    def cli(self, *args: str) -> subprocess.Popen:
        """A ``cloze`` command started in the background (``finish`` collects it)."""
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", *args],
            cwd=REPO,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    # ---- documents ----------------------------------------------------------------------------------

    def new_docs(self, count: int) -> list[dict[str, Any]]:
        docs = []
        with self._lock:
            while len(docs) < count:
                text = " ".join(self.rng.choice(TINY_WORDS) for _ in range(14))
                if text in self._texts:
                    continue
                self._texts.add(text)
                self._serial += 1
                docs.append({"id": f"doc-{self._serial}", "text": text})
        return docs

    def put(self, docs: list[dict[str, Any]], timeout: float = 60) -> int:
        """PUT /documents; the documents count as acknowledged only on a 200."""
        assert self.server is not None
        try:
            answer = httpx.put(self.server.url + "/documents", json=docs, headers=AUTH, timeout=timeout)
        except httpx.HTTPError:
            return 0
        if answer.status_code == 200:
            with self._lock:
                self.acked.update({d["id"]: d["text"] for d in docs})
        return answer.status_code

    def put_in_background(self, count: int) -> threading.Thread:
        """One write that will hang at a pause point: it must not count unless it is answered."""
        thread = threading.Thread(target=self.put, args=(self.new_docs(count), 200), daemon=True)
        thread.start()
        return thread

    def stream(self, stop: threading.Event, clients: int = 2, batch: int = 1) -> list[threading.Thread]:
        def run() -> None:
            while not stop.is_set():
                if self.put(self.new_docs(batch), timeout=30) == 0:
                    return  # the server is gone

        threads = [threading.Thread(target=run, daemon=True) for _ in range(clients)]
        for thread in threads:
            thread.start()
        return threads

    def rebuild(self) -> str:
        assert self.server is not None
        answer = httpx.post(self.server.url + "/index/rebuild", headers=AUTH, timeout=30)
        assert answer.status_code == 202, answer.text
        return answer.json()["job_id"]

    def job(self, job_id: str, timeout: float = 120) -> dict[str, Any]:
        assert self.server is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = httpx.get(f"{self.server.url}/jobs/{job_id}", headers=AUTH, timeout=10).json()
            if status["status"] in ("succeeded", "failed"):
                return status
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} still running after {timeout}s")

    def wait_paused(self, stage: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError):
                if self.marker.read_text() == stage:
                    return
            if self.server is not None and self.server.process.poll() is not None:
                raise RuntimeError(f"server died before {stage}:\n{self.server.tail()}")
            time.sleep(0.05)
        raise TimeoutError(f"never paused at {stage}:\n{self.server.tail() if self.server else ''}")

    def resume(self) -> None:
        self.marker.unlink()

    # ---- the checker --------------------------------------------------------------------------------

    def check(self, case: str, **extra: Any) -> dict[str, Any]:
        """Every acknowledged document is there, with its text, its own top dense hit and among the BM25 hits
        for its text; vectors == chunks. Records one row of the report."""
        assert self.server is not None
        url, found, problems = self.server.url, 0, []
        with httpx.Client(base_url=url, headers=AUTH, timeout=30) as http:
            for doc_id, text in sorted(self.acked.items()):
                got = http.get(f"/documents/{doc_id}")
                hits = http.post("/search", json={"query": text, "top_k": 1, "mode": "dense"})
                top = hits.json()["results"] if hits.status_code == 200 else []
                # Every document holding a query term scores, so an indexed one is in the whole list (a top 10
                # is not enough where the corpus's few words tie across hundreds of documents).
                lexical = http.post("/search", json={"query": text, "top_k": BM25_DEPTH, "mode": "bm25"})
                words = (
                    {hit["id"] for hit in lexical.json()["results"]} if lexical.status_code == 200 else set()
                )
                kept = got.status_code == 200 and got.json()["text"] == text
                if kept and top and top[0]["id"] == doc_id and doc_id in words:
                    found += 1
                elif len(problems) < 5:
                    problems.append(
                        f"{doc_id}: GET {got.status_code}, top {top[:1]}, found by BM25: {doc_id in words}"
                    )
            counts = http.get("/index/fields").json()["counts"]
        row = {
            "case": case,
            "acknowledged": len(self.acked),
            "found": found,
            "lost": len(self.acked) - found,
            "documents": counts["documents"],
            "chunks": counts["chunks"],
            "vectors": counts["vectors"],
            **extra,
        }
        self.results.append(row)
        assert not problems and counts["vectors"] == counts["chunks"], (row, problems)
        return row

    def metric(self, name: str) -> float:
        assert self.server is not None
        text = httpx.get(self.server.url + "/metrics", headers=AUTH, timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    # ---- the disk -----------------------------------------------------------------------------------

    def fill_disk(self) -> Path:
        """Ballast until the filesystem of the index refuses another byte."""
        ballast = self.root.parent / "ballast"
        with ballast.open("ab", buffering=0) as handle:  # unbuffered: nothing pending after ENOSPC
            for block in (1 << 20, 1 << 12, 1 << 9):
                with contextlib.suppress(OSError):
                    while True:
                        handle.write(b"\1" * block)
        return ballast

    def free_disk(self) -> None:
        (self.root.parent / "ballast").unlink(missing_ok=True)

    def versions(self) -> list[int]:
        return sorted(int(p.name) for p in (self.root / "versions").iterdir() if p.name.isdigit())

    def current(self) -> int:
        return int((self.root / "CURRENT").read_text())


def finish(process: subprocess.Popen) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=180)
    return process.returncode, stderr


def wait_ready(server: Server, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + "/readyz", headers=AUTH, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{server.url} not ready after {timeout}s:\n{server.tail()}")


def readiness(server: Server) -> tuple[int, str]:
    with contextlib.suppress(httpx.HTTPError):
        answer = httpx.get(server.url + "/readyz", headers=AUTH, timeout=2)
        return answer.status_code, answer.json().get("reason", "")
    return 0, ""


# ---- the cases, in the order one chain runs them (each restart checks the case before) ---------------


def run_all(
    chain: Chain,
    stream_acks: int = 40,
    batch: int = 5,
    pointer_damage: tuple[str, ...] = ("deleted", "garbled"),
) -> list[dict[str, Any]]:
    """Every case on one index. ``stream_acks``: acknowledged writes before the kill of case 1;
    ``pointer_damage``: what is done to ``CURRENT`` before a restart (each a restart of its own)."""
    # 1. SIGKILL during a stream of upserts from two clients.
    chain.start("s1-stream")
    stop = threading.Event()
    threads = chain.stream(stop)
    while len(chain.acked) < stream_acks:
        time.sleep(0.02)
    chain.kill()
    stop.set()
    for thread in threads:
        thread.join(timeout=30)

    # 2. SIGKILL during a snapshot: the FAISS file renamed into place, its JSON not yet written.
    chain.start("s2-snapshot", {"CLOZE_INDEX_SNAPSHOT_EVERY": "5", "CLOZE_INDEX_PAUSE_AT": "snapshot"})
    chain.check("SIGKILL during a stream of upserts (2 clients)")
    chain.arm()
    _pause_with_writes(chain, "snapshot")
    folder = chain.root / "versions" / str(chain.current())
    newer = (folder / "vectors.faiss").stat().st_mtime_ns >= (folder / "vectors.json").stat().st_mtime_ns
    chain.kill()

    # 3. SIGKILL during a rebuild with writes going on, after two second writers were refused and a
    #    standby service found the index locked; the standby takes over when the writer dies.
    chain.start("s3-rebuild", {"CLOZE_INDEX_PAUSE_AT": "rebuild"})
    chain.check(
        "SIGKILL between the FAISS file and its JSON (snapshot)",
        faiss_newer_than_json=newer,
        count_repairs=chain.metric('cloze_index_repairs_total{reason="count-mismatch"}'),
    )
    assert newer and chain.results[-1]["count_repairs"] == 0  # the replay itself was idempotent
    chain.arm()
    chain.put(chain.new_docs(batch))
    chain.rebuild()
    chain.wait_paused("rebuild")
    for _ in range(3):  # acknowledged while the rebuild runs
        assert chain.put(chain.new_docs(batch)) == 200
    extra = chain.work / "extra.jsonl"
    extra.write_text(
        "".join(json.dumps({"id": d["id"], "text": d["text"]}) + "\n" for d in chain.new_docs(2))
    )
    model = ["--model", str(chain.model), "--backend", "torch"]
    adding = chain.cli("index", "add", "--index", str(chain.root), "--input", str(extra), *model)
    building = chain.cli("index", "build", "--input", str(extra), "--out", str(chain.root), *model)
    workers = chain.cli("serve", "--port", str(free_port()), "--workers", "2")
    standby = chain.spawn("s4-standby", {"CLOZE_INDEX_PAUSE_AT": "publish"})
    deadline = time.monotonic() + 240
    while (state := readiness(standby))[0] != 503 or "writing" not in state[1]:
        assert time.monotonic() < deadline and standby.process.poll() is None, standby.tail()
        time.sleep(0.2)
    (add_exit, add_err), (build_exit, build_err), (workers_exit, workers_err) = (
        finish(process)
        for process in (adding, building, workers)  # all done before the writer dies
    )
    draft = max(chain.versions())
    chain.kill()
    chain.server = standby
    wait_ready(standby)
    chain.check(
        "SIGKILL during a rebuild with writes going on; second writers refused (CLI add, CLI build, "
        "--workers 2, a second service: standby until the writer died)",
        cli_add_exit=add_exit,
        cli_add_refused="open for writing by another process" in add_err,
        cli_build_exit=build_exit,
        cli_build_refused="another build is running" in build_err,
        workers_exit=workers_exit,
        workers_refused="needs a read-only index" in workers_err,
        standby_refused="open for writing by another process" in state[1],
        draft_removed=draft not in chain.versions(),
    )
    assert add_exit != 0 and "open for writing by another process" in add_err, add_err
    assert build_exit != 0 and "another build is running" in build_err, build_err
    assert workers_exit != 0 and "needs a read-only index" in workers_err, workers_err
    assert draft not in chain.versions()

    # 4. SIGKILL paused at publish (the new version complete, CURRENT not switched); a write waits.
    chain.arm()
    chain.put(chain.new_docs(batch))
    chain.rebuild()
    chain.wait_paused("publish")
    waiting = chain.put_in_background(batch)
    time.sleep(0.3)
    chain.kill()
    waiting.join(timeout=30)

    # 5. SIGKILL after publish, before the live swap; a write waits.
    chain.start("s5-swap", {"CLOZE_INDEX_PAUSE_AT": "swap"})
    chain.check("SIGKILL paused at publish (a write waiting)")
    chain.arm()
    chain.put(chain.new_docs(batch))
    before = chain.current()
    chain.rebuild()
    chain.wait_paused("swap")
    published = chain.current() > before
    waiting = chain.put_in_background(batch)
    time.sleep(0.3)
    chain.kill()
    waiting.join(timeout=30)

    # 6. A truncated vectors.faiss.
    chain.start("s6-truncated")
    chain.check("SIGKILL after publish, before the swap (a write waiting)", current_switched=published)
    chain.put(chain.new_docs(batch))
    chain.kill()
    faiss_file = chain.root / "versions" / str(chain.current()) / "vectors.faiss"
    size = faiss_file.stat().st_size
    with faiss_file.open("r+b") as handle:
        handle.truncate(size // 2)

    chain.start("s7-pointer")
    chain.check(
        "vectors.faiss truncated to half",
        repairs=chain.metric('cloze_index_repairs_total{reason="damaged-vectors"}'),
    )
    assert chain.results[-1]["repairs"] >= 1

    # 7, 8. A missing or a garbled CURRENT; the last restart also runs 9. (a full disk during upserts,
    # a snapshot and a rebuild).
    for number, damage in enumerate(pointer_damage):
        chain.put(chain.new_docs(batch))
        chain.kill()
        if damage == "deleted":
            (chain.root / "CURRENT").unlink()
        else:
            (chain.root / "CURRENT").write_bytes(b"\x00garbage\xff")
        if number == len(pointer_damage) - 1:
            env = {"CLOZE_INDEX_SNAPSHOT_EVERY": "5", "CLOZE_INDEX_PAUSE_AT": "snapshot-start,rebuild"}
            chain.start("s9-full-disk", env)
        else:
            chain.start(f"s8-pointer-{number}")
        chain.check(
            f"CURRENT {damage}",
            pointer_restored=chain.current() > 0,
            repairs=chain.metric('cloze_index_repairs_total{reason="fallback-version"}'),
        )
        assert chain.results[-1]["repairs"] >= 1
    chain.arm()
    disk = _full_disk(chain, batch)
    chain.kill()

    chain.start("s10-after-full-disk")
    chain.check("full disk during upserts, a snapshot and a rebuild, then space returns", **disk)
    chain.kill()
    return chain.results


def _put_until_paused(chain: Chain, paused: threading.Event) -> None:
    """One write at a time until one of them reaches the armed pause point (that one waits there)."""
    while not paused.is_set():
        if chain.put(chain.new_docs(1), timeout=200) != 200:
            return
        time.sleep(0.05)


def _pause_with_writes(chain: Chain, stage: str) -> threading.Thread:
    paused = threading.Event()
    writer = threading.Thread(target=_put_until_paused, args=(chain, paused), daemon=True)
    writer.start()
    chain.wait_paused(stage)
    paused.set()
    return writer


def _full_disk(chain: Chain, batch: int) -> dict[str, Any]:
    statuses: list[int] = []
    # A snapshot meets a full disk: the write that triggers it is committed and answers 200.
    writer = _pause_with_writes(chain, "snapshot-start")
    chain.fill_disk()
    chain.resume()
    writer.join(timeout=60)
    snapshot_refused = "could not save the FAISS snapshot" in chain.server.log.read_text()
    # Upserts on the full disk: 200 (it fitted in pages SQLite already had) or 507, never a 500.
    for _ in range(40):
        statuses.append(chain.put(chain.new_docs(batch)))
        if statuses[-1] != 200:
            break
    chain.free_disk()
    after_space = chain.put(chain.new_docs(batch))
    # A rebuild meets a full disk: the job fails with the reason and leaves no version folder behind.
    versions = chain.versions()
    job = chain.rebuild()
    chain.wait_paused("rebuild")
    chain.fill_disk()
    chain.resume()
    status = chain.job(job)
    refused_during_rebuild = chain.put(chain.new_docs(batch))
    left_behind = [v for v in chain.versions() if v not in versions]
    chain.free_disk()
    after_rebuild = chain.put(chain.new_docs(batch))
    rebuilt = chain.job(chain.rebuild())["status"]
    result = {
        "snapshot_refused_logged": snapshot_refused,
        "upsert_statuses": sorted(set(statuses)),
        "write_after_space_returns": after_space,
        "rebuild_job": f"{status['status']}: {(status.get('error') or '')[:80]}",
        "write_during_full_rebuild": refused_during_rebuild,
        "rebuild_left_behind": left_behind,
        "write_after_rebuild_failed": after_rebuild,
        "rebuild_after_space_returns": rebuilt,
    }
    assert snapshot_refused and 507 in statuses and set(statuses) <= {200, 507}, result
    assert after_space == after_rebuild == 200 and status["status"] == "failed", result
    assert "disk is full" in (status.get("error") or "") and not left_behind, result
    assert refused_during_rebuild in (200, 507) and rebuilt == "succeeded", result
    return result
