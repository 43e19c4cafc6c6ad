"""The fault record's scenarios beyond the tests' own (``test_fault_round`` in test_loopback.py runs them round
after round on the loopback cluster for benchmarks/replication_faults.py): the writer killed mid-writes just
after it cut a base past its last segment, then started again; the bucket applying the writer's requests while
their answers are lost, then a failover by the runbook (docs/deployment.md); ``CURRENT.json`` damaged, then put
back. Each measures rather than stops at its first surprise, so that its record says what went wrong: the
writes acknowledged (``ack=remote`` and ``local``), those lost, whether each replica equals the writer and how
long they took to get there, and what ``/readyz`` said meanwhile."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
from botocore.exceptions import ClientError

from harness.crashes import AUTH, Server
from harness.replication import BUCKET, PREFIX
from index.replication.bucket import Keys
from tests.replication.conftest import Cluster, documents, wait_converged

CONVERGE_S = 60  # after the fault: longer than any healthy catch-up here, short enough for 20 rounds
MOST_TRANSITIONS = 40  # of what one server said, per scenario
SLOW_BUCKET_S = 0.2  # how late the bucket answers the writer while a restart waits for its moment


class Writes:
    """Clients writing one document a request to whoever is the writer, each taking turns over ``modes``
    (``ack=remote`` / ``ack=local``); what each write was answered, and what was acknowledged by mode. Two
    clients at once, as concurrent writers share the shipper's segments."""

    def __init__(self, cluster: Cluster, modes: tuple[str, ...] = ("remote", "local"), clients: int = 2):
        self.cluster, self.modes = cluster, modes
        self.acked: dict[str, dict[str, str]] = {"remote": {}, "local": {}}
        self.answers: Counter[str] = Counter()
        self.stop = threading.Event()
        self.guard = threading.Lock()
        self.clients = [threading.Thread(target=self.run, daemon=True) for _ in range(clients)]

    def start(self) -> None:
        for client in self.clients:
            client.start()

    def run(self) -> None:
        turn = 0
        while not self.stop.is_set():
            mode = self.modes[turn % len(self.modes)]
            turn += 1
            doc = self.cluster.chain.new_docs(1)[0]
            try:
                url = self.cluster.writer.url + "/documents"
                answer = httpx.put(url, params={"ack": mode}, json=[doc], headers=AUTH, timeout=30)
            except (httpx.HTTPError, AssertionError):  # the writer is down (or being replaced)
                self.count(f"{mode} no answer")
                self.stop.wait(0.2)
                continue
            self.count(f"{mode} {answer.status_code}")
            if answer.status_code == 200:
                with self.guard:
                    self.acked[mode][doc["id"]] = doc["text"]
            # a writer that is starting answers 503 at once: no need to hammer it
            self.stop.wait(0.05 if answer.status_code == 200 else 0.2)

    def count(self, answer: str) -> None:
        with self.guard:
            self.answers[answer] += 1

    def finish(self) -> None:
        self.stop.set()
        for client in self.clients:
            client.join(timeout=60)


def readyz(server: Server | None) -> tuple[int | str, dict[str, Any]]:
    """(HTTP status or "down", the default collection's replication state)."""
    try:
        answer = httpx.get(server.url + "/readyz", headers=AUTH, timeout=5)  # type: ignore[union-attr]
    except (httpx.HTTPError, AttributeError):
        return "down", {}
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return answer.status_code, answer.json()["collections"]["default"]["replication"]
    return answer.status_code, {}


class StatusLog(threading.Thread):
    """What ``/readyz`` said every 0.5 s on the writer and each replica: each change of what a server claimed
    (status, stale, error, waiting, fenced), the highest lag it reported, and how long a replica stood still
    behind what the writer had shipped while claiming to be fresh (not stale, no error): a silent divergence."""

    def __init__(self, cluster: Cluster):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.started = time.monotonic()
        self.said: dict[str, list] = {}
        self.max_lag: dict[str, int] = {}
        self.max_behind: dict[str, int] = {}
        self.stuck_fresh_s: dict[str, float] = {}
        # replica -> (since when, at which sequence) it stood still behind while saying it was fresh
        self._stuck: dict[str, tuple[float, int | None]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(0.5)

    def sample(self) -> None:
        now = time.monotonic()
        code, writer = readyz(self.cluster.chain.server)
        self.note("writer", code, {"fenced": bool(writer.get("fenced")), "error": short(writer.get("error"))})
        for number, server in enumerate(list(self.cluster.replicas)):
            name = f"replica{number}"
            code, state = readyz(server)
            claim = {k: state.get(k) for k in ("stale", "waiting")} | {"error": short(state.get("error"))}
            self.note(name, code, claim)
            self.max_lag[name] = max(self.max_lag.get(name, 0), state.get("lag") or 0)
            fresh = code == 200 and not claim["stale"] and not claim["error"]
            self.watch_stuck(name, now, fresh, state, writer)

    def watch_stuck(self, name: str, now: float, fresh: bool, state: dict, writer: dict) -> None:
        same = [state.get(k) for k in ("epoch", "version")] == [writer.get(k) for k in ("epoch", "version")]
        applied, shipped = state.get("applied_seq"), writer.get("shipped_seq")
        behind = shipped - applied if same and applied is not None and shipped is not None else 0
        self.max_behind[name] = max(self.max_behind.get(name, 0), behind)
        since, at = self._stuck.get(name, (now, applied))
        if not (fresh and behind > 0 and applied == at):
            since, at = now, applied
        self._stuck[name] = (since, at)
        self.stuck_fresh_s[name] = round(max(self.stuck_fresh_s.get(name, 0.0), now - since), 1)

    def note(self, name: str, code: int | str, claim: dict) -> None:
        said = self.said.setdefault(name, [])
        if not said or said[-1][1:] != [code, claim]:
            said.append([round(time.monotonic() - self.started, 1), code, claim])

    def finish(self) -> dict[str, Any]:
        self.stop.set()
        self.join(timeout=30)
        return {
            "said": {name: said[:MOST_TRANSITIONS] for name, said in self.said.items()},
            "max_lag_reported": self.max_lag,
            "max_behind_shipped": self.max_behind,
            "stood_still_behind_while_fresh_s": self.stuck_fresh_s,
        }


def short(error: str | None) -> str | None:
    return error[:100] if error else None


class BucketView:
    """The default collection's objects as a replica finds them, read from moto directly (no proxy)."""

    def __init__(self, cluster: Cluster):
        self.client = cluster.moto.client()
        self.keys = Keys(f"{PREFIX}/default")
        # (epoch, version) -> the last sequence a segment reached, as far as seen
        self.highest: dict[tuple[int, int], int] = {}

    def current(self) -> tuple[bytes, dict[str, Any] | None]:
        body = self.client.get_object(Bucket=BUCKET, Key=self.keys.current)["Body"].read()
        with contextlib.suppress(ValueError):
            return body, json.loads(body)
        return body, None

    def segments(self, current: dict[str, Any]) -> list[tuple[int, int]]:
        prefix = self.keys.tail(int(current["epoch"]), int(current["version"]))
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [Keys.segment_range(item["Key"]) for page in pages for item in page.get("Contents", [])]

    def base_past_tail(self) -> tuple[bool, dict[str, Any]]:
        """Whether ``CURRENT.json``'s base stands past every segment of its version seen so far (segments
        behind a settled base are deleted, so the highest is remembered across looks)."""
        _, current = self.current()
        assert current is not None
        position = (int(current["epoch"]), int(current["version"]))
        highest = max([through for _, through in self.segments(current)] + [self.highest.get(position, 0)])
        self.highest[position] = highest
        return int(current["base_seq"]) > highest, current

    def tail_breaks(self) -> dict[str, int]:
        """In the current version's tail: segments that start before the previous one ended (overlaps) or
        after it (gaps), what the issue's ambiguous puts left behind."""
        _, current = self.current()
        found = {"segments": 0, "overlaps": 0, "gaps": 0}
        if current is None:
            return found
        ranges = sorted(self.segments(current))
        found["segments"] = len(ranges)
        for (_, through), (after, _) in zip(ranges, ranges[1:], strict=False):
            if after != through:
                found["overlaps" if after < through else "gaps"] += 1
        return found


def outcome(
    cluster: Cluster, writes: Writes, log: StatusLog, local_may_be_lost: bool = False
) -> dict[str, Any]:
    """After the fault (writes stopped): seconds until every replica held the writer's last sequence, which
    acknowledged writes the writer and each replica lack, whether each equals the writer, what /readyz said.
    ``ok``: converged, every replica equal, no acknowledged write lost (a failover that lost the writer's
    volume may lose ``local`` ones: ``local_may_be_lost``)."""
    try:
        converged: float | None = round(wait_converged(cluster, timeout=CONVERGE_S), 2)
    except TimeoutError:
        converged = None
    held = {"writer": holding(cluster.writer)}
    held |= {f"replica{number}": holding(server) for number, server in enumerate(cluster.replicas)}
    lost = {  # None: that server would not list its documents
        mode: {name: None if docs is None else sorted(set(acked) - set(docs)) for name, docs in held.items()}
        for mode, acked in writes.acked.items()
    }
    equal = [held[name] is not None and held[name] == held["writer"] for name in held if name != "writer"]
    lost_counts = {
        mode: {name: None if ids is None else len(ids) for name, ids in found.items()}
        for mode, found in lost.items()
    }
    remote_lost = any(count != 0 for count in lost_counts["remote"].values())
    local_lost = any(count != 0 for count in lost_counts["local"].values()) and not local_may_be_lost
    record = {
        "acked": {mode: len(acked) for mode, acked in writes.acked.items()},
        "answers": dict(sorted(writes.answers.items())),
        "lost": lost_counts,
        "lost_remote_ids": (lost["remote"]["writer"] or [])[:10],
        "replicas_equal_writer": equal,
        "converged_s": converged,
        "status": log.finish(),
    }
    record["ok"] = converged is not None and all(equal) and not remote_lost and not local_lost
    # The tests' scenarios that follow compare replicas with the chain's ledger: writes answered 503 or cut by
    # a kill may have committed, and a failover may lose local ones. Counted above, the ledger starts again
    # from what the writer holds.
    cluster.chain.acked = {doc_id: text for doc_id, (text, _) in (held["writer"] or {}).items()}
    return record


def holding(server: Server) -> dict[str, tuple[str, dict]] | None:
    try:
        return documents(server)
    except (AssertionError, httpx.HTTPError):
        return None


@contextlib.contextmanager
def running(
    cluster: Cluster, modes: tuple[str, ...] = ("remote", "local")
) -> Iterator[tuple[Writes, StatusLog]]:
    """The status log and the writes running; stopped however the scenario ends (a scenario that raised must
    not leave writes going into the next), the writer's bucket answering again."""
    log, writes = StatusLog(cluster), Writes(cluster, modes)
    log.start()
    writes.start()
    try:
        yield writes, log
    finally:
        writes.finish()
        log.stop.set()
        cluster.writer_proxy.delay_s = 0.0
        if cluster.writer_proxy.losing:
            cluster.writer_proxy.answer_again()


def began_converged(cluster: Cluster) -> bool:
    """Whether the scenario found the cluster converged: a round after a failed one may not."""
    try:
        wait_converged(cluster, timeout=CONVERGE_S)
        return True
    except TimeoutError:
        return False


def a_writer_restart_after_a_base(cluster: Cluster, base_every: int, watch_s: float = 30) -> dict[str, Any]:
    """The writer killed (SIGKILL) mid-writes right after it cut a base past its last segment, then started
    again on its volume while writes go on: a tail resumed from its last segment instead of the base begins
    behind where a replica copied from that base stands, and that replica skips it (issue 66). Before the
    kill it cuts a base every ``base_every`` changes, so that one comes within seconds; after it, bases are
    as rare as the writer's settings make them (20,000 changes by default), so a gap stays open as it would
    in service instead of closing at the next base."""
    usual = cluster.writer_env
    cluster.chain.kill()
    cluster.chain.start("writer", usual | {"CLOZE_REPLICATION_BASE_EVERY": str(base_every)})
    converged = began_converged(cluster)
    bucket = BucketView(cluster)
    bucket.base_past_tail()  # what stood before: the base to wait past
    first_base = bucket.current()[1]["base"]  # type: ignore[index]
    # Local acks only until the kill: a remote one wakes the shipper at once, so a segment follows each base
    # before anyone can look. A slow bucket widens the moment between a segment and the base after it (writes
    # land in between: the base stands past the segment) and makes that state last long enough to be seen.
    with running(cluster, modes=("local",)) as (writes, log):
        cluster.writer_proxy.delay_s = SLOW_BUCKET_S
        deadline = time.monotonic() + watch_s
        while time.monotonic() < deadline:
            past, current = bucket.base_past_tail()
            if past and current["base"] != first_base:
                break
            time.sleep(0.03)
        waited = round(watch_s - (deadline - time.monotonic()), 1)
        cluster.writer.kill()
        cluster.writer_proxy.delay_s = 0.0
        time.sleep(0.5)  # a request in flight at the kill lands or not: look afterwards
        past, current = bucket.base_past_tail()
        writes.modes = ("remote", "local")
        cluster.restart_writer()  # as it usually runs
        time.sleep(5)
        writes.finish()
        return {
            "began_converged": converged,
            "waited_for_base_s": waited,
            "base_past_last_segment_at_kill": past,
            "base_seq_at_kill": current["base_seq"],
            **outcome(cluster, writes, log),
        }


def lost_answers_then_failover(cluster: Cluster, lost_s: float, how: str) -> dict[str, Any]:
    """The writer's requests reach the bucket for ``lost_s`` seconds while their answers are lost (``how``:
    dropped, the client times out, or the connection closed), writes going on; then the writer's host dies
    and a replica is promoted by the runbook. ``ok`` needs every remote-acknowledged write on the new writer
    and every replica."""
    converged = began_converged(cluster)
    with running(cluster) as (writes, log):
        time.sleep(2)
        cluster.writer_proxy.lose_answers(how)
        time.sleep(lost_s)
        cluster.writer_proxy.answer_again()
        time.sleep(3)
        writes.finish()
        breaks = BucketView(cluster).tail_breaks()  # before the failover: then the old epoch's tail goes
        _, writer = readyz(cluster.writer)
        failover = fail_over(cluster)
        return {
            "began_converged": converged,
            "lost_answers_s": lost_s,
            "answers_were": how,
            "tail": breaks,
            "old_writer": {k: writer.get(k) for k in ("seq", "shipped_seq", "unshipped", "error")},
            "failover": failover,
            **outcome(cluster, writes, log, local_may_be_lost=True),
        }


def fail_over(cluster: Cluster, wait_s: float = 30) -> dict[str, Any]:
    """docs/deployment.md's failover runbook as an operator runs it after the writer's host died."""
    # 1. Fence the old writer: it is gone, and its volume with it.
    dead = cluster.writer_env
    cluster.chain.kill()
    for folder in (dead["CLOZE_INDEX"], dead["CLOZE_COLLECTIONS_DIR"]):
        shutil.rmtree(folder, ignore_errors=True)
    # 2. The replica with the highest applied_seq of CURRENT.json's version, once a poll of it after the
    # writer stopped found nothing newer (its caught_up_s younger than the writer's death): lag and
    # staleness come from the dead writer's last heartbeat, which can be behind its last segment.
    bucket, began = BucketView(cluster), time.monotonic()
    while True:
        version = bucket.current()[1]["version"]  # type: ignore[index]
        states = [readyz(server)[1] for server in cluster.replicas]
        ranked = [(s["applied_seq"] or -1, n) for n, s in enumerate(states) if s.get("version") == version]
        pick = max(ranked)[1] if ranked else 0
        caught_up = states[pick].get("caught_up_s")
        ready = caught_up is not None and caught_up < time.monotonic() - began
        if ready or time.monotonic() - began > wait_s:
            break
        time.sleep(0.3)
    # 3. The epoch, from collections.json.
    registry = cluster.moto.client().get_object(Bucket=BUCKET, Key=f"{PREFIX}/collections.json")
    epoch = int(json.loads(registry["Body"].read())["epoch"]) + 1
    # 4. That replica restarted as the writer on its volume at the next epoch; 5. writes go to it (the
    # cluster's writer). Its slot gets a fresh replica on a new volume.
    cluster.replicas[pick].kill()
    promoted = time.monotonic()
    cluster.start_writer(on=cluster.volume_of(pick), epoch=epoch)
    writer_ready_s = time.monotonic() - promoted
    cluster.volumes[pick] = f"replica{pick}-e{epoch}"
    cluster.start_replica(pick)
    said = ("applied_seq", "caught_up_s", "lag", "staleness_s", "stale", "error")
    return {
        "runbook_wait_met": ready,
        "runbook_waited_s": round(promoted - began, 1),
        "replicas_said": [{k: s.get(k) for k in said} for s in states],
        "promoted": f"replica{pick}",
        "epoch": epoch,
        "promoted_ready_s": round(writer_ready_s, 1),
    }


def repair_if_stuck(cluster: Cluster) -> bool:
    """What an operator can do when replicas cannot get past the tail: a rebuild on the writer, whose new
    version's base every replica copies (a fresh replica would stop at the same broken tail). Only where a
    scenario left them behind (a product that repairs itself never needs it), so that one scenario's damage
    does not spill into the next ones' records; True when it was needed."""
    try:
        wait_converged(cluster, timeout=10)
        return False
    except TimeoutError:
        pass
    cluster.chain.job(cluster.chain.rebuild(), timeout=300)
    with contextlib.suppress(TimeoutError):
        wait_converged(cluster, timeout=CONVERGE_S)
    return True


def damaged(body: bytes, how: str) -> bytes:
    """``CURRENT.json`` cut in half (not JSON), or with one digit of its version flipped (still valid)."""
    if how == "garbled":
        return body[: len(body) // 2]
    current = json.loads(body)
    version = str(current["version"])
    current["version"] = int(version[:-1] + str((int(version[-1]) + 1) % 10))
    return json.dumps(current, sort_keys=True).encode()


def current_damaged_and_put_back(cluster: Cluster, how: str, damaged_s: float = 4) -> dict[str, Any]:
    """``CURRENT.json`` damaged (``how``: see ``damaged``) for ``damaged_s`` seconds under writes, then put
    back as it was, unless the writer wrote a newer one meanwhile (an older one put over it would be a fault
    of its own)."""
    converged, bucket = began_converged(cluster), BucketView(cluster)
    with running(cluster) as (writes, log):
        time.sleep(2)
        original, _ = bucket.current()
        key = bucket.keys.current
        etag = bucket.client.put_object(Bucket=BUCKET, Key=key, Body=damaged(original, how))["ETag"]
        time.sleep(damaged_s)
        try:
            bucket.client.put_object(Bucket=BUCKET, Key=key, Body=original, IfMatch=etag)
            put_back = True
        except ClientError:
            put_back = False
        time.sleep(3)
        writes.finish()
        return {
            "began_converged": converged,
            "damage": how,
            "damaged_s": damaged_s,
            "put_back": put_back,
            "tail": bucket.tail_breaks(),
            **outcome(cluster, writes, log),
        }
