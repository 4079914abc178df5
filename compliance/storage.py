"""Object storage for sensitive files, one bucket (or folder) per region.

Two backends with one interface:
- `S3Store`: S3 through boto3, one bucket per region, server-side encryption on every object
  (SSE-KMS with the region's key where COMPLIANCE_S3_KMS_KEYS names one, else SSE-S3).
- `LocalStore` (the embedded default): one folder per region, every object encrypted by the
  application with AES-256-GCM in 1 MiB records, each bound to its object name and position, so
  a swapped, reordered or truncated file does not decrypt.

The store never decides where data goes: callers pass the region their organization's policy
chose (`compliance.services`). The store itself refuses regions the deployment does not have,
objects above the size limit (checked while streaming: S3-compatible servers do not enforce
it), and, on S3, a bucket whose actual location is not the region's configured one.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

_MAGIC = b"TGE1"
_RECORD_BYTES = 1 << 20
_NONCE_BYTES = 12


class StorageError(Exception):
    """A storage refusal or failure; the message names the rule or the cause."""


class ObjectTooLarge(StorageError):
    pass


class RegionNotAvailable(StorageError):
    pass


@dataclass(frozen=True)
class PutResult:
    size_bytes: int
    sha256: str  # of the plaintext


class ObjectStore(Protocol):
    def put(self, *, region: str, key: str, stream: IO[bytes], max_bytes: int) -> PutResult: ...
    def get(self, *, region: str, key: str, target: IO[bytes]) -> None: ...
    def delete(self, *, region: str, key: str) -> None: ...
    def list_keys(self, *, region: str, prefix: str) -> list[str]: ...
    def delete_prefix(self, *, region: str, prefix: str) -> int: ...


class _LimitedReader:
    """Reads a stream, hashing and counting, and stops past `max_bytes`."""

    def __init__(self, stream: IO[bytes], max_bytes: int) -> None:
        self._stream = stream
        self._max = max_bytes
        self.size = 0
        self.exceeded = False
        self._hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        chunk = self._stream.read(n if n and n > 0 else _RECORD_BYTES)
        self.size += len(chunk)
        if self.size > self._max:
            self.exceeded = True
            raise ObjectTooLarge(f"the object is larger than the limit of {self._max:,} bytes")
        self._hash.update(chunk)
        return chunk

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


def _check_region(region: str) -> None:
    if region not in settings.COMPLIANCE_REGIONS:
        raise RegionNotAvailable(
            f"region {region!r} is not one of this deployment's regions ({', '.join(settings.COMPLIANCE_REGIONS)})"
        )


def _check_key(key: str) -> None:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in {"", ".", ".."} for p in parts):
        raise StorageError(f"invalid object key {key!r}")


def _storage_key() -> bytes:
    configured = settings.COMPLIANCE_STORAGE_KEY
    if configured:
        try:
            key = base64.urlsafe_b64decode(configured)
        except ValueError:
            key = b""
        if len(key) != 32:
            raise StorageError("COMPLIANCE_STORAGE_KEY must be 32 bytes in url-safe base64")
        return key
    # Unset: derived from SECRET_KEY (domain-separated), see settings.
    return hashlib.sha256(b"tailguard-storage:" + settings.SECRET_KEY.encode()).digest()


def seal(plain: bytes, *, purpose: str) -> bytes:
    """Encrypts a small secret (e.g. a TOTP seed) with the storage key, bound to its purpose."""
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + AESGCM(_storage_key()).encrypt(nonce, plain, purpose.encode())


def unseal(sealed: bytes, *, purpose: str) -> bytes:
    try:
        return AESGCM(_storage_key()).decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], purpose.encode())
    except Exception:
        raise StorageError("a sealed secret failed its integrity check") from None


class LocalStore:
    def __init__(self, root: Path, key: bytes) -> None:
        self.root = root
        self._aead = AESGCM(key)

    def _path(self, region: str, key: str) -> Path:
        _check_region(region)
        _check_key(key)
        return self.root / region / key

    @staticmethod
    def _aad(region: str, key: str, index: int, last: bool) -> bytes:
        return f"{region}/{key}|{index}|{int(last)}".encode()

    def put(self, *, region: str, key: str, stream: IO[bytes], max_bytes: int) -> PutResult:
        path = self._path(region, key)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        reader = _LimitedReader(stream, max_bytes)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".put-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(_MAGIC)
                chunk = reader.read(_RECORD_BYTES)
                index = 0
                while True:
                    following = reader.read(_RECORD_BYTES) if chunk else b""
                    last = not following
                    nonce = os.urandom(_NONCE_BYTES)
                    sealed = self._aead.encrypt(nonce, chunk, self._aad(region, key, index, last))
                    out.write(struct.pack(">I", len(sealed)) + nonce + sealed)
                    if last:
                        break
                    chunk, index = following, index + 1
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return PutResult(size_bytes=reader.size, sha256=reader.sha256)

    def _records(self, region: str, key: str) -> Iterator[bytes]:
        path = self._path(region, key)
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            raise StorageError(f"object {key!r} is missing in region {region!r}") from None
        with handle:
            if handle.read(len(_MAGIC)) != _MAGIC:
                raise StorageError(f"object {key!r} is not an encrypted Tailguard object")
            index = 0
            while True:
                header = handle.read(4)
                if len(header) < 4:
                    raise StorageError(f"object {key!r} is truncated")
                (length,) = struct.unpack(">I", header)
                nonce = handle.read(_NONCE_BYTES)
                sealed = handle.read(length)
                last = handle.peek(1) == b"" if hasattr(handle, "peek") else False
                try:
                    yield self._aead.decrypt(nonce, sealed, self._aad(region, key, index, last))
                except Exception:
                    raise StorageError(f"object {key!r} failed its integrity check") from None
                if last:
                    return
                index += 1

    def get(self, *, region: str, key: str, target: IO[bytes]) -> None:
        for plain in self._records(region, key):
            target.write(plain)

    def delete(self, *, region: str, key: str) -> None:
        self._path(region, key).unlink(missing_ok=True)

    def list_keys(self, *, region: str, prefix: str) -> list[str]:
        _check_region(region)
        base = self.root / region
        if not base.is_dir():
            return []
        keys = []
        for path in base.rglob("*"):
            if path.is_file() and not path.name.startswith(".put-"):
                name = path.relative_to(base).as_posix()
                if name.startswith(prefix):
                    keys.append(name)
        return sorted(keys)

    def delete_prefix(self, *, region: str, prefix: str) -> int:
        keys = self.list_keys(region=region, prefix=prefix)
        for key in keys:
            self.delete(region=region, key=key)
        return len(keys)


class S3Store:
    def __init__(
        self,
        *,
        buckets: dict[str, str],
        kms_keys: dict[str, str],
        region_names: dict[str, str],
        endpoint_url: str | None,
        timeout_s: int,
    ) -> None:
        self.buckets = buckets
        self.kms_keys = kms_keys
        self.region_names = region_names
        self.endpoint_url = endpoint_url
        self.timeout_s = timeout_s
        self._clients: dict[str, Any] = {}
        self._verified: set[str] = set()

    def _client(self, region: str) -> Any:
        import boto3
        from botocore.config import Config

        if region not in self._clients:
            self._clients[region] = boto3.client(
                "s3",
                region_name=self.region_names.get(region, "us-east-1"),
                endpoint_url=self.endpoint_url,
                config=Config(
                    connect_timeout=self.timeout_s,
                    read_timeout=self.timeout_s,
                    retries={"max_attempts": 3, "mode": "standard"},
                ),
            )
        return self._clients[region]

    def _bucket(self, region: str) -> str:
        """The region's bucket, after checking once that it really lives in that region."""
        _check_region(region)
        bucket = self.buckets.get(region)
        if bucket is None:
            raise RegionNotAvailable(f"no bucket is configured for region {region!r}")
        expected = self.region_names.get(region)
        if expected and region not in self._verified:
            location = self._client(region).get_bucket_location(Bucket=bucket).get("LocationConstraint")
            actual = location or "us-east-1"
            if actual != expected:
                raise RegionNotAvailable(
                    f"bucket {bucket!r} for region {region!r} is in {actual!r}, not {expected!r}; refusing to use it"
                )
            self._verified.add(region)
        return bucket

    def put(self, *, region: str, key: str, stream: IO[bytes], max_bytes: int) -> PutResult:
        _check_key(key)
        bucket = self._bucket(region)
        kms = self.kms_keys.get(region)
        extra = (
            {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms}
            if kms
            else {"ServerSideEncryption": "AES256"}
        )
        reader = _LimitedReader(stream, max_bytes)
        try:
            self._client(region).upload_fileobj(reader, bucket, key, ExtraArgs=extra)
        except Exception as exc:
            if reader.exceeded:
                self.delete(region=region, key=key)
                raise ObjectTooLarge(f"the object is larger than the limit of {max_bytes:,} bytes") from None
            raise StorageError(
                f"could not store the object in region {region!r}: {type(exc).__name__}"
            ) from exc
        return PutResult(size_bytes=reader.size, sha256=reader.sha256)

    def get(self, *, region: str, key: str, target: IO[bytes]) -> None:
        _check_key(key)
        self._client(region).download_fileobj(self._bucket(region), key, target)

    def delete(self, *, region: str, key: str) -> None:
        _check_key(key)
        self._client(region).delete_object(Bucket=self._bucket(region), Key=key)

    def list_keys(self, *, region: str, prefix: str) -> list[str]:
        paginator = self._client(region).get_paginator("list_objects_v2")
        keys: list[str] = []
        for page in paginator.paginate(Bucket=self._bucket(region), Prefix=prefix):
            keys.extend(item["Key"] for item in page.get("Contents", []))
        return keys

    def delete_prefix(self, *, region: str, prefix: str) -> int:
        keys = self.list_keys(region=region, prefix=prefix)
        client, bucket = self._client(region), self._bucket(region)
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            client.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
        return len(keys)


_stores: dict[tuple[Any, ...], ObjectStore] = {}


def get_store() -> ObjectStore:
    """The configured store (rebuilt when the settings change, as they do in tests)."""
    if settings.COMPLIANCE_STORAGE_BACKEND == "s3":
        config: tuple[Any, ...] = (
            "s3",
            tuple(sorted(settings.COMPLIANCE_S3_BUCKETS.items())),
            tuple(sorted(settings.COMPLIANCE_S3_KMS_KEYS.items())),
            tuple(sorted(settings.COMPLIANCE_S3_REGION_NAMES.items())),
            settings.COMPLIANCE_S3_ENDPOINT_URL,
        )
        if config not in _stores:
            _stores[config] = S3Store(
                buckets=dict(settings.COMPLIANCE_S3_BUCKETS),
                kms_keys=dict(settings.COMPLIANCE_S3_KMS_KEYS),
                region_names=dict(settings.COMPLIANCE_S3_REGION_NAMES),
                endpoint_url=settings.COMPLIANCE_S3_ENDPOINT_URL,
                timeout_s=settings.COMPLIANCE_S3_TIMEOUT_S,
            )
        return _stores[config]
    return LocalStore(Path(settings.COMPLIANCE_STORAGE_DIR), _storage_key())
