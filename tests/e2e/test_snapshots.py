"""Issue 46 against real `cloze serve` processes (tiny random model, a loopback port each):

- upserts stream from two clients, a snapshot is taken in the middle (held at its ``backup`` pause point,
  the instant fixed and the store not yet copied, while more writes are acknowledged), and the archive,
  uploaded into a fresh service, holds every document acknowledged before the snapshot began and none
  acknowledged while it ran (those are in the live collection);
- truncated, bit-flipped and foreign archives, a second snapshot, unknown names, an oversized upload, a
  full snapshot disk and an offline restore beside the live writer are refused with a reason, and the live
  collection is untouched;
- SIGKILL while a snapshot's archive waits under its temp name, and during a restore (its version complete
  but unpublished; then marked published, ``CURRENT`` not switched): after a restart nothing is half
  published, no partial archive is listed, and every acknowledged document is there.
"""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.crashes import AUTH, Chain, finish, mount_tmpfs, unmount

SNAPSHOTS = "/collections/default/snapshots"


def snapshot_in_background(url: str, answers: list[httpx.Response]) -> threading.Thread:
    def ask() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server may be killed before it answers
            answers.append(httpx.post(url + SNAPSHOTS, headers=AUTH, timeout=180))

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    return thread


def upload_until_killed(url: str, archive: Path) -> None:
    with contextlib.suppress(httpx.HTTPError):
        upload(url, archive, 120)


def upload(url: str, archive: Path | bytes, timeout: float = 180) -> httpx.Response:
    body = archive if isinstance(archive, bytes) else archive.read_bytes()
    headers = AUTH | {"Content-Type": "application/octet-stream"}
    return httpx.post(url + "/collections/default/restore", content=body, headers=headers, timeout=timeout)


def download(url: str, name: str, out: Path) -> Path:
    answer = httpx.get(f"{url}{SNAPSHOTS}/{name}", headers=AUTH, timeout=60)
    assert answer.status_code == 200, answer.text
    out.write_bytes(answer.content)
    return out


class Stream:
    """Two clients upserting batches of 3; each acknowledged batch is recorded with two instants that bound the
    server's own: ``sent`` (taken before the request leaves: the server received it later) and ``answered``
    (taken after the answer arrived: the server acknowledged it earlier). A batch's thread may be held up
    between the answer and the clock under load, so only these bounds, never one reading, say on which side of
    a snapshot's instant a write fell."""

    def __init__(self, chain: Chain):
        self.chain, self.stop = chain, threading.Event()
        self.acked: list[tuple[float, float, list[str]]] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(2)]
        for thread in self.threads:
            thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            docs = self.chain.new_docs(3)
            sent = time.monotonic()
            if self.chain.put(docs, timeout=30) == 200:
                answered = time.monotonic()
                with self.lock:
                    self.acked.append((sent, answered, [d["id"] for d in docs]))

    def sent_after(self, instant: float) -> set[str]:
        """Batches the server received after ``instant``."""
        with self.lock:
            return {i for sent, _, ids in self.acked if sent >= instant for i in ids}

    def answered_after(self, instant: float) -> set[str]:
        """Batches that may have been acknowledged after ``instant`` (the others certainly were before)."""
        with self.lock:
            return {i for _, answered, ids in self.acked if answered >= instant for i in ids}

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


def present(url: str, ids: set[str]) -> set[str]:
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as http:
        return {i for i in ids if http.get(f"/documents/{i}").status_code == 200}


@pytest.mark.slow
def test_a_snapshot_mid_stream_restores_exactly_the_writes_acknowledged_before_it(
    tmp_path: Path, tiny_bert: Path
) -> None:
    chain = Chain(root=tmp_path / "live", model=tiny_bert, work=tmp_path)
    snaps = {"CLOZE_SNAPSHOTS_DIR": str(tmp_path / "snaps")}
    chain.start("live", snaps | {"CLOZE_INDEX_PAUSE_AT": "backup"})
    fresh = Chain(root=tmp_path / "fresh", model=tiny_bert, work=tmp_path)
    try:
        assert chain.put(chain.new_docs(60)) == 200
        chain.arm()
        stream = Stream(chain)
        while len(chain.acked) < 150:
            time.sleep(0.02)
        answers: list[httpx.Response] = []
        asked = time.monotonic()
        snapshot = snapshot_in_background(chain.server.url, answers)
        chain.wait_paused("backup")  # the instant is fixed: writes go on, into the live collection only
        paused = time.monotonic()  # after the instant: a batch sent from now on is after it too
        while len(stream.sent_after(paused)) < 30:
            time.sleep(0.02)
        chain.resume()
        snapshot.join(timeout=120)
        stream.finish()
        assert answers and answers[0].status_code == 201, answers[0].text if answers else "no answer"
        entry = answers[0].json()
        # Acknowledged before the snapshot was asked for: in it. Sent after it paused: not in it. The others
        # (answered after the ask, sent before the pause was seen) raced the instant: either side.
        before = {doc_id for doc_id in chain.acked if doc_id not in stream.answered_after(asked)}
        during = stream.sent_after(paused)
        assert present(chain.server.url, during) == during  # the live collection has them

        archive = download(chain.server.url, entry["name"], tmp_path / "download.tar")
        fresh.start("fresh")
        restored = upload(fresh.server.url, archive)
        assert restored.status_code == 200, restored.text
        fresh.acked = {doc_id: chain.acked[doc_id] for doc_id in before}
        row = fresh.check(
            "restored into a fresh service"
        )  # each one found, its own top hit, vectors == chunks
        in_flight = stream.answered_after(asked) - during
        found_in_flight = present(fresh.server.url, in_flight)
        print(row, {"during": len(during), "in_flight": len(in_flight), "of_them_kept": len(found_in_flight)})
        assert present(fresh.server.url, during) == set()
        assert row["documents"] == entry["documents"] == len(before) + len(found_in_flight)
    finally:
        for server in (chain.server, fresh.server):
            if server is not None:
                server.kill()


def middle_of(archive: Path, name: str) -> int:
    """The byte offset of the middle of member ``name``'s data (not the archive's zero padding)."""
    with tarfile.open(archive) as opened:
        member = opened.getmember(name)
        return member.offset_data + member.size // 2


def foreign(good: Path, out: Path, **fields: Any) -> Path:
    """``good`` with fields of its ``snapshot.json`` replaced, checksums left valid."""
    with tarfile.open(good) as source, tarfile.open(out, "w") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read()
            if member.name == "snapshot.json":
                data = json.dumps(json.loads(data) | fields).encode()
            member.size = len(data)
            target.addfile(member, io.BytesIO(data))
    return out


@pytest.mark.slow
def test_bad_archives_and_bounds_are_refused_with_a_reason_and_the_live_data_is_untouched(
    tmp_path: Path, tiny_bert: Path
) -> None:
    chain = Chain(root=tmp_path / "live", model=tiny_bert, work=tmp_path)
    tiny_disk = tmp_path / "tiny-disk"
    mount_tmpfs(tiny_disk, 1)
    env = {"CLOZE_SNAPSHOTS_DIR": str(tmp_path / "snaps"), "CLOZE_MAX_SNAPSHOT_UPLOAD_BYTES": "4000000"}
    chain.start("live", env | {"CLOZE_INDEX_PAUSE_AT": "backup-written"})
    try:
        for _ in range(6):
            assert chain.put(chain.new_docs(50)) == 200
        url = chain.server.url
        chain.arm()
        answers: list[httpx.Response] = []
        first = snapshot_in_background(url, answers)
        chain.wait_paused("backup-written")
        second = httpx.post(url + SNAPSHOTS, headers=AUTH, timeout=30)
        assert second.status_code == 409 and "already running" in second.json()["error"]
        assert (
            httpx.get(url + SNAPSHOTS, headers=AUTH).json()["snapshots"] == []
        )  # the temp name is not listed
        chain.resume()
        first.join(timeout=60)
        good = download(url, answers[0].json()["name"], tmp_path / "good.tar")
        later = chain.new_docs(20)
        assert chain.put(later) == 200  # after the snapshot: a restore would lose these
        current, versions = chain.current(), chain.versions()

        raw = good.read_bytes()
        flipped = bytearray(raw)
        flipped[middle_of(good, "store.sqlite")] ^= 0x04
        cases = {
            "truncated": (raw[: len(raw) * 2 // 3], "truncated"),
            "bit-flipped": (bytes(flipped), "corrupted"),
            "another model": (
                foreign(good, tmp_path / "m.tar", model_fingerprint="f" * 16).read_bytes(),
                "model",
            ),
            "another format": (foreign(good, tmp_path / "f.tar", format=7).read_bytes(), "snapshot format 7"),
        }
        for case, (body, words) in cases.items():
            answer = upload(url, body)
            assert answer.status_code == 422, (case, answer.status_code, answer.text)
            assert words in answer.json()["error"] and answer.json()["field"] == "archive", (
                case,
                answer.text,
            )
        too_big = upload(url, b"\0" * 4_000_001)
        assert too_big.status_code == 413 and "CLOZE_MAX_SNAPSHOT_UPLOAD_BYTES" in too_big.json()["error"]
        chunked = httpx.post(  # no Content-Length: the route counts the streamed bytes itself
            url + "/collections/default/restore",
            content=iter([b"\0" * 1_000_000] * 5),
            headers=AUTH | {"Content-Type": "application/octet-stream"},
            timeout=60,
        )
        assert chunked.status_code == 413 and "CLOZE_MAX_SNAPSHOT_UPLOAD_BYTES" in chunked.json()["error"]
        assert not [p for p in (tmp_path / "snaps").iterdir() if p.name.startswith(".upload")]
        assert chain.current() == current and chain.versions() == versions
        chain.check("after refused restores")

        assert httpx.post(url + "/collections/other/snapshots", headers=AUTH).status_code == 404
        missing = httpx.get(f"{url}{SNAPSHOTS}/snapshot-19700101T000000000000Z.tar", headers=AUTH)
        assert missing.status_code == 404 and missing.json()["field"] == "snapshot"
        for bad in ("..%2F..%2Fetc%2Fpasswd", ".snapshot.lock", "x.zip"):
            answer = httpx.delete(f"{url}{SNAPSHOTS}/{bad}", headers=AUTH)
            assert answer.status_code in (404, 422) and answer.status_code != 200, (bad, answer.text)
        assert httpx.post(url + SNAPSHOTS).status_code == 401  # a write key is needed

        offline = chain.cli(
            "index", "restore", str(good), "--collection", "default", "--index", str(chain.root)
        )
        code, stderr = finish(offline)
        assert code != 0 and "open for writing by another process (pid" in stderr, stderr
        listed = chain.cli("index", "snapshot", "--url", url, "--api-key", AUTH["Authorization"].split()[1])
        code, _ = finish(listed)
        assert code == 0 and len(httpx.get(url + SNAPSHOTS, headers=AUTH).json()["snapshots"]) == 2
        key = AUTH["Authorization"].split()[1]
        rollback = chain.cli(
            "index", "restore", str(good), "--collection", "default", "--url", url, "--api-key", key
        )
        code, stderr = finish(rollback)
        assert code == 0 and chain.current() == current + 1, stderr
        assert httpx.get(f"{url}/documents/{later[0]['id']}", headers=AUTH).status_code == 404  # rolled back
        for doc in later:
            del chain.acked[doc["id"]]
        chain.check("after a restore by upload from the CLI")

        chain.kill()
        chain.start("tiny-disk", {"CLOZE_SNAPSHOTS_DIR": str(tiny_disk)})
        full = httpx.post(chain.server.url + SNAPSHOTS, headers=AUTH, timeout=60)
        assert full.status_code == 507 and "MiB free" in full.json()["error"], full.text
        chain.check("after a snapshot refused for space")
    finally:
        if chain.server is not None:
            chain.server.kill()
        unmount(tiny_disk)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # four server starts; under a loaded machine each can take a minute
def test_sigkill_during_a_snapshot_and_during_a_restore_publishes_nothing_half(
    tmp_path: Path, tiny_bert: Path
) -> None:
    chain = Chain(root=tmp_path / "live", model=tiny_bert, work=tmp_path)
    snaps = tmp_path / "snaps"
    env = {"CLOZE_SNAPSHOTS_DIR": str(snaps)}
    chain.start("s1", env | {"CLOZE_INDEX_PAUSE_AT": "backup-written"})
    try:
        for _ in range(4):
            assert chain.put(chain.new_docs(50)) == 200
        chain.arm()
        snapshot_in_background(chain.server.url, [])
        chain.wait_paused("backup-written")
        partial = [p.name for p in snaps.iterdir() if p.name.endswith(".partial")]
        assert partial, list(snaps.iterdir())
        chain.kill()

        # Each restart checks the case before, then arms the next pause point (a restore's).
        chain.start("s2", env | {"CLOZE_INDEX_PAUSE_AT": "restore"})
        chain.check("SIGKILL while a snapshot's archive waits under its temp name")
        url = chain.server.url
        assert httpx.get(url + SNAPSHOTS, headers=AUTH).json()["snapshots"] == []
        made = httpx.post(url + SNAPSHOTS, headers=AUTH, timeout=60)
        assert made.status_code == 201
        assert not [p for p in snaps.iterdir() if p.name.endswith(".partial")]  # the leftover went
        good = download(url, made.json()["name"], tmp_path / "good.tar")
        assert chain.put(chain.new_docs(30)) == 200  # not in the snapshot
        current, versions = chain.current(), chain.versions()
        for stage, after in (("restore", "publish"), ("publish", "")):
            chain.arm()
            threading.Thread(target=upload_until_killed, args=(chain.server.url, good), daemon=True).start()
            chain.wait_paused(stage)
            assert len(chain.versions()) == len(versions) + 1  # the restored version is on disk
            chain.kill()
            chain.start(f"after-{stage}", env | ({"CLOZE_INDEX_PAUSE_AT": after} if after else {}))
            assert chain.current() == current and chain.versions() == versions, (stage, chain.versions())
            print(chain.check(f"SIGKILL during a restore at {stage}"))

        assert upload(chain.server.url, good).status_code == 200
        count = httpx.get(chain.server.url + "/index/fields", headers=AUTH).json()["counts"]["documents"]
        assert count == made.json()["documents"] == 200
    finally:
        if chain.server is not None:
            chain.server.kill()
