"""An S3-compatible bucket (AWS, MinIO, Garage, SeaweedFS, moto) as replication's shared layer, and where a
collection's objects live in it:

    <prefix>/<collection>/CURRENT.json                       the base to copy: written last, conditionally
    <prefix>/<collection>/e<epoch>/heartbeat.json            the writer of that epoch: its position, its time
    <prefix>/<collection>/e<epoch>/v<version>/base-<seq>.tar a snapshot archive (``index.archive.snapshots``)
    <prefix>/<collection>/e<epoch>/v<version>/tail/<after>-<through>.json.gz   changes past it, immutable

The epoch is the fence of a manual failover: replicas follow only the epoch ``CURRENT.json`` names, so a
writer of an older epoch (a zombie) uploads where no replica looks. Credentials come from the usual AWS
variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``) or the host's role, never from cloze's settings.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

SEQ_DIGITS = 12  # keys sort by sequence as text
DELETE_BATCH = 1000
# A base downloads in a few large ranged GETs rather than boto3's 8 MB ones: a store that reads the object for
# each range (moto's server) copied a 300 MB base 5x slower in 8 MB parts; S3 serves either at full speed.
DOWNLOAD = TransferConfig(multipart_chunksize=64 << 20, max_concurrency=4)
# Short timeouts: a cut network or a paused bucket must show up as an error within seconds, not hang a
# replica's follower or a remote-mode write.
CLIENT_CONFIG = Config(
    connect_timeout=2, read_timeout=5, retries={"max_attempts": 2, "mode": "standard"}, tcp_keepalive=True
)


class BucketUnavailable(RuntimeError):
    """The bucket did not answer, or answered an error other than a refused condition."""


class ConditionFailed(RuntimeError):
    """A conditional write was refused: the object changed (or exists) since it was read."""


class Fenced(RuntimeError):
    """Another writer holds the collection (a higher epoch, or the same epoch elsewhere): this one stops."""


def collection_key(name: str, incarnation: str | None = None) -> str:
    """The folder of one collection's objects. A collection deleted and created again under the same name
    must not follow its predecessor's objects: the incarnation (``CollectionInfo.incarnation``; ``default`` has none) keeps them apart."""
    return name if incarnation is None else f"{name}@{incarnation}"


@dataclass(frozen=True)
class Keys:
    """The object keys of one collection (``collection`` as ``collection_key`` spells it)."""

    root: str  # "<prefix>/<collection>"

    @property
    def current(self) -> str:
        return f"{self.root}/CURRENT.json"

    def heartbeat(self, epoch: int) -> str:
        return f"{self.root}/e{epoch}/heartbeat.json"

    def version(self, epoch: int, version: int) -> str:
        return f"{self.root}/e{epoch}/v{version}"

    def base(self, epoch: int, version: int, seq: int) -> str:
        return f"{self.version(epoch, version)}/base-{seq:0{SEQ_DIGITS}d}.tar"

    def tail(self, epoch: int, version: int) -> str:
        return f"{self.version(epoch, version)}/tail/"

    def segment(self, epoch: int, version: int, after: int, through: int) -> str:
        return f"{self.tail(epoch, version)}{after:0{SEQ_DIGITS}d}-{through:0{SEQ_DIGITS}d}.json.gz"

    @staticmethod
    def segment_range(key: str) -> tuple[int, int]:
        after, through = key.rsplit("/", 1)[1].split(".", 1)[0].split("-")
        return int(after), int(through)


class Bucket:
    """The few calls replication makes; every failure is ``BucketUnavailable`` or ``ConditionFailed``."""

    def __init__(self, url: str, endpoint: str | None = None, region: str | None = None, client: Any = None):
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"CLOZE_REPLICATION_BUCKET: {url!r} is not an s3://bucket[/prefix] address")
        self.name, self.prefix = parsed.netloc, parsed.path.strip("/")
        self.client = client or boto3.client(
            "s3", endpoint_url=endpoint or None, region_name=region or None, config=CLIENT_CONFIG
        )

    def keys(self, collection: str) -> Keys:
        return Keys(f"{self.prefix}/{collection}" if self.prefix else collection)

    def _call(self, method: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, method)(Bucket=self.name, **kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                raise ConditionFailed(f"{kwargs.get('Key')}: {code}") from exc
            if code in ("NoSuchKey", "404", "NotFound"):
                raise KeyError(kwargs.get("Key")) from exc
            raise BucketUnavailable(f"s3://{self.name}/{kwargs.get('Key', '')}: {exc}") from exc
        except BotoCoreError as exc:  # connection refused, timeouts, a dropped connection
            raise BucketUnavailable(f"s3://{self.name}: {exc}") from exc

    def get_json(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """The object as JSON and its ETag; (None, None) when there is none."""
        data, etag = self.get_bytes(key)
        return (json.loads(data), etag) if data is not None else (None, None)

    def get_bytes(self, key: str) -> tuple[bytes | None, str | None]:
        try:
            answer = self._call("get_object", Key=key)
            return self._read(answer), answer["ETag"]
        except KeyError:
            return None, None

    def _read(self, answer: dict[str, Any]) -> bytes:
        try:
            return answer["Body"].read()
        except (BotoCoreError, OSError) as exc:
            raise BucketUnavailable(f"s3://{self.name}: reading an object failed: {exc}") from exc

    def etag(self, key: str) -> str | None:
        try:
            return self._call("head_object", Key=key)["ETag"]
        except KeyError:
            return None

    def put_bytes(
        self, key: str, data: bytes, *, if_match: str | None = None, if_absent: bool = False
    ) -> str:
        """Write ``key``; with ``if_match`` only over that ETag, with ``if_absent`` only where none exists
        (S3's conditional writes): ``ConditionFailed`` otherwise. Returns the new ETag."""
        conditions: dict[str, str] = {}
        if if_match is not None:
            conditions["IfMatch"] = if_match
        elif if_absent:
            conditions["IfNoneMatch"] = "*"
        return self._call("put_object", Key=key, Body=data, **conditions)["ETag"]

    def put_json(self, key: str, value: dict[str, Any], **conditions: Any) -> str:
        return self.put_bytes(key, json.dumps(value, sort_keys=True).encode(), **conditions)

    def upload_file(self, key: str, path: Path, progress: Callable[[int], None] | None = None) -> None:
        try:
            self.client.upload_file(str(path), self.name, key, Callback=progress)
        except (BotoCoreError, ClientError, boto3.exceptions.S3UploadFailedError) as exc:
            raise BucketUnavailable(f"upload of s3://{self.name}/{key} failed: {exc}") from exc

    def download_file(self, key: str, path: Path, progress: Callable[[int], None] | None = None) -> None:
        """``KeyError`` when there is no such object (garbage collection took an old base)."""
        try:
            self.client.download_file(self.name, key, str(path), Callback=progress, Config=DOWNLOAD)
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in ("NoSuchKey", "404", "NotFound"):
                raise KeyError(key) from exc
            raise BucketUnavailable(f"download of s3://{self.name}/{key} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise BucketUnavailable(f"download of s3://{self.name}/{key} failed: {exc}") from exc

    def list_after(self, prefix: str, start_after: str) -> list[str]:
        """Keys under ``prefix`` that sort after ``start_after``, in order."""
        return [item["Key"] for item in self._listing(prefix, start_after)]

    def list_with_times(self, prefix: str) -> list[tuple[str, float]]:
        """Every key under ``prefix`` with when it was written (seconds since the epoch, the store's clock)."""
        return [(item["Key"], item["LastModified"].timestamp()) for item in self._listing(prefix, "")]

    def folders(self) -> list[str]:
        """The names of the folders right under the prefix (a collection's, ``collection_key``, each)."""
        top = f"{self.prefix}/" if self.prefix else ""
        pages = self._pages(Prefix=top, Delimiter="/")
        return [
            found["Prefix"][len(top) :].rstrip("/")
            for page in pages
            for found in page.get("CommonPrefixes", [])
        ]

    def _listing(self, prefix: str, start_after: str) -> Iterator[dict[str, Any]]:
        for page in self._pages(Prefix=prefix, StartAfter=start_after):
            yield from page.get("Contents", [])

    def _pages(self, **query: str) -> Iterator[dict[str, Any]]:
        token: dict[str, str] = {}
        while True:
            page = self._call("list_objects_v2", **query, **token)
            yield page
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def delete(self, keys: list[str]) -> None:
        """Delete ``keys`` (absent ones are no error), a thousand per request (S3's most)."""
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": key} for key in keys[start : start + DELETE_BATCH]]
            answer = self._call("delete_objects", Delete={"Objects": batch, "Quiet": True})
            if failed := answer.get("Errors"):
                raise BucketUnavailable(f"s3://{self.name}: {len(failed)} deletes refused, e.g. {failed[0]}")
