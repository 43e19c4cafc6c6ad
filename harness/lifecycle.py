"""Collection lifecycles and checked writes for the soak (``benchmarks/soak.py``), beside its wrk traffic.

``Lifecycle`` loops: an admin key creates a collection, the collection's scoped write key fills it, searches
it and snapshots it, the other collection's key is refused there, more writes land, the stored snapshot is
restored, then its download is restored by upload, and the admin deletes the collection. Every document it
had acknowledged is checked where it must be: present, or (written after the snapshot) gone after the
restore. ``AcknowledgedWriter`` upserts uniquely named documents into the default collection and snapshots it
now and then; ``check`` reads every acknowledged one back at the end.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import httpx

ADMIN_KEY = "soak-admin-key-0123456789"
SCOPED_KEYS = {"soak-a": "soak-key-a-0123456789", "soak-b": "soak-key-b-0123456789"}
SNAPSHOT_EVERY_S = 45


class Recorder(threading.Thread):
    """A thread that counts each request's (step, status) and stops when told."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.http = httpx.Client(base_url=url, timeout=120)
        self.stop = threading.Event()
        self.statuses: Counter[str] = Counter()
        self.failures: list[str] = []

    def call(self, step: str, method: str, path: str, key: str, **kwargs: Any) -> httpx.Response | None:
        headers = kwargs.pop("headers", {}) | {"Authorization": f"Bearer {key}"}
        try:
            reply = self.http.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            self.statuses[f"{step} {type(exc).__name__}"] += 1
            return None
        self.statuses[f"{step} {reply.status_code}"] += 1
        if reply.status_code >= 500:
            self.failures.append(f"{step}: {reply.status_code} {reply.text[:200]}")
        return reply

    def run(self) -> None:
        try:
            self.work()
        except Exception as exc:  # noqa: BLE001  (reported: a driver that stops must not pass for a clean run)
            self.failures.append(f"the driver stopped: {type(exc).__name__}: {exc}")

    def work(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=300)

    def report(self) -> dict[str, Any]:
        five_xx = sum(n for name, n in self.statuses.items() if name.rsplit(" ", 1)[1].startswith("5"))
        return {
            "requests": sum(self.statuses.values()),
            "five_xx": five_xx,
            "statuses": dict(sorted(self.statuses.items())),
            "failures": self.failures[:20],
        }


def documents(prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"{prefix}-{i}",
            "text": f"{prefix} lighthouse keeper {i} polished the great lens",
            "metadata": {"i": i},
        }
        for i in range(count)
    ]


class Lifecycle(Recorder):
    def __init__(self, url: str):
        super().__init__(url)
        self.rounds = 0
        self.checked = 0
        self.lost: list[str] = []
        self.resurrected: list[str] = []

    def work(self) -> None:
        while not self.stop.is_set():
            self.one_round(sorted(SCOPED_KEYS)[self.rounds % len(SCOPED_KEYS)])
            self.rounds += 1

    def present(self, base: str, key: str, ids: list[str]) -> set[str]:
        found = set()
        for doc_id in ids:
            reply = self.call("read back", "GET", f"{base}/documents/{doc_id}", key)
            if reply is not None and reply.status_code == 200:
                found.add(doc_id)
        return found

    def expect(self, base: str, key: str, kept: list[str], gone: list[str]) -> None:
        self.checked += len(kept) + len(gone)
        self.lost += sorted(set(kept) - self.present(base, key, kept))
        self.resurrected += sorted(self.present(base, key, gone))

    def one_round(self, name: str) -> None:
        key, other = SCOPED_KEYS[name], next(k for n, k in SCOPED_KEYS.items() if n != name)
        base = f"/collections/{name}"
        created = self.call("create", "POST", "/collections", ADMIN_KEY, json={"name": name})
        if created is None or created.status_code != 201:
            time.sleep(1)  # a delete of the last round may still be finishing
            self.call("delete leftover", "DELETE", base, ADMIN_KEY)
            return
        before: list[str] = []
        for batch in range(3):
            docs = documents(f"{name}-r{self.rounds}-b{batch}", 4)
            reply = self.call("upsert", "PUT", f"{base}/documents", key, json=docs)
            if reply is not None and reply.status_code == 200:
                before += [d["id"] for d in docs]
        for mode in ("dense", "hybrid"):
            self.call(
                f"search {mode}",
                "POST",
                f"{base}/search",
                key,
                json={"query": "lighthouse lens", "mode": mode},
            )
        self.call("other collection's key", "PUT", f"{base}/documents", other, json=documents("intruder", 1))
        snapshot = self.call("snapshot", "POST", f"{base}/snapshots", key)
        after = documents(f"{name}-r{self.rounds}-after", 3)
        reply = self.call("upsert", "PUT", f"{base}/documents", key, json=after)
        written_after = [d["id"] for d in after] if reply is not None and reply.status_code == 200 else []
        self.expect(base, key, before + written_after, [])
        if snapshot is not None and snapshot.status_code == 201:
            snap = snapshot.json()["name"]
            restored = self.call("restore stored", "POST", f"{base}/snapshots/{snap}/restore", key)
            if restored is not None and restored.status_code == 200:
                self.expect(base, key, before, written_after)
            archive = self.call("download", "GET", f"{base}/snapshots/{snap}", key)
            if archive is not None and archive.status_code == 200:
                headers = {"Content-Type": "application/octet-stream"}
                uploaded = self.call(
                    "restore upload", "POST", f"{base}/restore", key, content=archive.content, headers=headers
                )
                if uploaded is not None and uploaded.status_code == 200:
                    self.expect(base, key, before, written_after)
        self.call("delete", "DELETE", base, ADMIN_KEY)

    def report(self) -> dict[str, Any]:
        return super().report() | {
            "rounds": self.rounds,
            "writes_checked": self.checked,
            "writes_lost": len(self.lost),
            "lost": self.lost[:20],
            "restored_past_their_snapshot": self.resurrected[:20],
        }


class AcknowledgedWriter(Recorder):
    def __init__(self, url: str):
        super().__init__(url)
        self.acknowledged: list[str] = []

    def work(self) -> None:
        last_snapshot, count = time.monotonic(), 0
        while not self.stop.is_set():
            doc = {"id": f"ack-{count}", "text": f"acknowledged write number {count} of the soak"}
            count += 1
            reply = self.call("upsert", "PUT", "/documents", ADMIN_KEY, json=[doc])
            if reply is not None and reply.status_code == 200:
                self.acknowledged.append(doc["id"])
            if time.monotonic() - last_snapshot > SNAPSHOT_EVERY_S:
                self.call("snapshot default", "POST", "/collections/default/snapshots", ADMIN_KEY)
                last_snapshot = time.monotonic()
            self.stop.wait(0.2)

    def check(self, url: str | None = None) -> dict[str, Any]:
        """Every acknowledged write read back from the server written to, or from ``url`` (a replica)."""
        http = httpx.Client(base_url=url, timeout=120) if url else self.http
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        missing = [
            doc_id
            for doc_id in self.acknowledged
            if http.get(f"/documents/{doc_id}", headers=headers).status_code != 200
        ]
        return {"checked": len(self.acknowledged), "lost": len(missing), "missing": missing[:20]}
