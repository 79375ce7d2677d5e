"""The compile cache: compiled modules (vmfb) stored under a content hash of the IR
after tori's passes, the targets with their resolved details, every flag and versions.

A local disk cache (TORI_CACHE_DIR, default ~/.cache/tori) with atomic writes and
least-recently-used eviction, optionally layered under a shared Redis cache
(TORI_CACHE_URL) whose entries are authenticated with HMAC (TORI_CACHE_KEY).

An entry is JSON metadata and raw vmfb bytes, never pickle:

    TORI-CACHE 1\\n
    {"key": ..., "blobs": [{"target": "cpu", "size": N}, ...], "meta": {...}, "sha256": ...}\\n
    <blob bytes, one after the other>

`sha256` covers the key, the blob list, the metadata and every blob byte; it is
checked before anything is loaded, so a corrupted or truncated entry is detected,
deleted, and its graph recompiled. A Redis value is `hmac-sha256 hex` + "\\n" +
the entry, the HMAC over the cache key and the entry: a writer without TORI_CACHE_KEY
cannot make another machine load its code.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import platform
import secrets
import tempfile
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from tori.config import Options
from tori.stats import counters
from tori.targets import Target

log = logging.getLogger("tori.cache")

MAGIC = b"TORI-CACHE 1\n"
ENTRY_SUFFIX = ".entry"
LOCK_SUFFIX = ".lock"
REDIS_PREFIX = "tori:cache:"
REDIS_LOCK_PREFIX = "tori:compiling:"
# How often a process waiting for another's compile looks for the entry.
POLL_S = 0.05
KEY_ENV = "TORI_CACHE_KEY"  # the HMAC secret of the shared cache; deliberately not an Option (never printed)
# A temporary entry file this old belongs to a writer that died: writing one takes milliseconds.
STALE_TEMPORARY_S = 3600


class CorruptEntry(Exception):
    """An entry whose bytes do not match its content hash (or are not an entry at all)."""


# --- what a key names -------------------------------------------------------

@lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    """The installed versions of tori, torch, torch-mlir and IREE ("unknown" where missing)."""
    found = {}
    for package in ("tori", "torch", "torch-mlir", "iree-base-compiler", "iree-base-runtime"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "unknown"
    return found


def versions() -> dict[str, str]:
    """package_versions(), and a digest of tori's sources, so that an edited checkout
    never reuses modules compiled by other code."""
    return {**package_versions(), "tori-sources": _sources_digest()}


def _sources_digest() -> str:
    root = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def host_cpu() -> dict[str, str]:
    """This machine's CPU as the kernel reports it: what LLVM resolves `host` from
    (vendor, family, model, feature flags), so a module built for one CPU is never
    reused on another."""
    found = {"machine": platform.machine()}
    wanted = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags",
              "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "Features", "isa")
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        found["processor"] = platform.processor()
        return found
    first = text.split("\n\n", 1)[0]
    for line in first.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in wanted:
            value = value.strip()
            found[name.strip()] = " ".join(sorted(value.split())) if name.strip() in ("flags", "Features") else value
    return found


def content_hash(ir: str | bytes, flags: Iterable[str], details: Mapping | None = None) -> str:
    """sha256 of what decides iree-compile's output: its input IR, its flags (dump
    flags left out), resolved target details and the versions of tori, torch,
    torch-mlir and IREE."""
    digest = hashlib.sha256(ir.encode() if isinstance(ir, str) else ir)
    for flag in flags:
        if not flag.startswith(("--dump-compilation-phases-to", "--mlir-elide")):
            digest.update(b"\0" + flag.encode())
    digest.update(json.dumps({"versions": versions(), "details": details or {}}, sort_keys=True).encode())
    return digest.hexdigest()


def compile_key(tori_ir: str, options: Options, codegen=None, extra: tuple[str, ...] = ()) -> str:
    """The key of one graph's modules: the IR after tori's passes, and per compiled
    target every iree-compile flag (the code generation strategy's `codegen` included,
    and `extra`, the main target's own) and, for a CPU compiled for `host`, the actual CPU."""
    from tori.targets.build import compiled_targets, invocation

    flags: list[str] = []
    details: dict = {}
    for i, target in enumerate(compiled_targets(options)):
        flags += [f"target={target.value}", *invocation(options, target, extra if i == 0 else (), codegen).flags]
        if target is Target.CPU and options.cpu == "host":
            details["host_cpu"] = host_cpu()
    return content_hash(tori_ir, flags, details)


def graph_key(record, options: Options) -> str | None:
    """The key of a compiled graph's modules (a GraphRecord's): the one its compile
    used, or, where it skipped the cache, the one it would have; None before tori's passes."""
    from tori.stages import Stage
    from tori.targets.build import in_process_flags

    if record.modules_key is not None:
        return record.modules_key
    if Stage.TORI not in record.stages:
        return None
    return compile_key(record.stages[Stage.TORI], options, record.codegen, in_process_flags(options))


# --- entries ----------------------------------------------------------------

def encode_entry(key: str, vmfbs: Mapping[Target, bytes], meta: Mapping | None = None) -> bytes:
    header = {"key": key, "blobs": [{"target": t.value, "size": len(b)} for t, b in vmfbs.items()],
              "meta": dict(meta or {})}
    header["sha256"] = _entry_digest(header, vmfbs.values())
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + b"".join(vmfbs.values())


def _entry_digest(header: Mapping, blobs: Iterable[bytes]) -> str:
    digest = hashlib.sha256(json.dumps({k: v for k, v in header.items() if k != "sha256"}, sort_keys=True).encode())
    for blob in blobs:
        digest.update(blob)
    return digest.hexdigest()


def decode_entry(key: str, data: bytes) -> dict[Target, bytes]:
    """The vmfbs of an entry; CorruptEntry unless every byte matches its content hash."""
    return read_entry(key, data)[0]


def read_entry(key: str, data: bytes) -> tuple[dict[Target, bytes], dict]:
    """The vmfbs and the metadata of an entry; CorruptEntry unless every byte matches
    its content hash."""
    if not data.startswith(MAGIC):
        raise CorruptEntry("not a tori cache entry")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise CorruptEntry("truncated header")
    try:
        header = json.loads(data[len(MAGIC):end])
        sizes = [(Target(b["target"]), int(b["size"])) for b in header["blobs"]]
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptEntry(f"unreadable header: {error}") from None
    if header.get("key") != key:
        raise CorruptEntry("entry of another key")
    body = memoryview(data)[end + 1:]
    if len(body) != sum(size for _, size in sizes):
        raise CorruptEntry(f"{len(body)} bytes of modules, the header says {sum(s for _, s in sizes)}")
    vmfbs, offset = {}, 0
    for target, size in sizes:
        vmfbs[target] = bytes(body[offset:offset + size])
        offset += size
    if not hmac.compare_digest(str(header.get("sha256", "")), _entry_digest(header, vmfbs.values())):
        raise CorruptEntry("content hash mismatch")
    return vmfbs, header.get("meta") if isinstance(header.get("meta"), dict) else {}


# --- the local disk cache ---------------------------------------------------

class DiskCache:
    """Entries as files `<dir>/<key[:2]>/<key>.entry`, written to a temporary file
    and renamed into place (a reader sees a whole entry or none); a hit refreshes
    the file's mtime, and eviction removes the least recently used entries once the
    total passes `max_bytes`."""

    def __init__(self, directory: Path, max_bytes: int):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._undeletable: set[str] = set()  # corrupted entries this process could not delete

    def path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}{ENTRY_SUFFIX}"

    @contextmanager
    def compiling(self, key: str, wait_s: float) -> Iterator[tuple[bool, bool]]:
        """Hold the lock of `key`'s entry among the processes sharing this directory,
        waiting up to `wait_s` for a process that holds it; yields whether this process
        holds it (not after the wait ran out, nor where no lock can be taken) and whether
        it waited. The kernel releases the lock of a process that dies (flock)."""
        path = self.path(key).with_suffix(LOCK_SUFFIX)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield False, False  # a read-only cache: nothing to coordinate through
            return
        try:
            deadline, waited = time.monotonic() + wait_s, False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                    break
                except BlockingIOError:
                    waited = True
                    if time.monotonic() >= deadline:
                        held = False
                        break
                    time.sleep(POLL_S)
            yield held, waited
        finally:
            os.close(fd)  # releases the lock; the file stays for the next compile of this key

    def get(self, key: str) -> dict[Target, bytes] | None:
        found = self.read(key)
        return found[0] if found is not None else None

    def read(self, key: str) -> tuple[dict[Target, bytes], dict] | None:
        """The entry under `key` (vmfbs and metadata), None when absent or corrupted."""
        path = self.path(key)
        if key in self._undeletable:
            return None
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            found = read_entry(key, data)
        except CorruptEntry as error:
            log.warning("tori: compile cache entry %s is corrupted (%s); deleted, the graph is recompiled", path, error)
            counters.cache_corrupt += 1
            try:
                path.unlink(missing_ok=True)
            except OSError:
                # A read-only cache: the entry stays, a miss for this process from now on
                # (and detected again by the next one).
                self._undeletable.add(key)
            return None
        try:
            os.utime(path)
        except OSError:
            pass  # evicted meanwhile by another process: the modules read are whole
        return found

    def put(self, key: str, entry: bytes) -> None:
        self._undeletable.discard(key)
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(entry)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self.evict(keep=path)

    def _remove_stale_temporaries(self) -> None:
        # A writer killed between mkstemp and rename leaves its temporary file: never
        # read (only *.entry is), but it would hold disk space forever.
        cutoff = time.time() - STALE_TEMPORARY_S
        for path in [*self.directory.glob("??/*.tmp"), *self.directory.glob(f"??/*{LOCK_SUFFIX}")]:
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
            except OSError:
                continue

    def entries(self) -> list[tuple[float, int, Path]]:
        found = []
        for path in self.directory.glob(f"??/*{ENTRY_SUFFIX}"):
            try:
                stat = path.stat()
            except OSError:
                continue
            found.append((stat.st_mtime, stat.st_size, path))
        return sorted(found)

    def evict(self, keep: Path | None = None) -> None:
        self._remove_stale_temporaries()
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            path.unlink(missing_ok=True)
            total -= size


# --- the shared Redis cache -------------------------------------------------

class RedisCache:
    """Entries in Redis, each value signed with HMAC-SHA256 under TORI_CACHE_KEY."""

    def __init__(self, url: str, secret: bytes):
        import redis

        self.url = url
        self._secret = secret
        self._client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._failed = False

    def _sign(self, key: str, entry: bytes) -> bytes:
        return hmac.new(self._secret, key.encode() + b"\0" + entry, hashlib.sha256).hexdigest().encode()

    def get(self, key: str) -> bytes | None:
        """The entry stored under `key`, None when absent or not signed with our key."""
        value = self._call("get", REDIS_PREFIX + key)
        if value is None:
            return None
        signature, _, entry = value.partition(b"\n")
        if not hmac.compare_digest(signature, self._sign(key, entry)):
            log.warning("tori: shared compile cache entry %s is not signed with this TORI_CACHE_KEY; refused", key)
            counters.cache_refused += 1
            return None
        return entry

    def put(self, key: str, entry: bytes) -> None:
        self._call("set", REDIS_PREFIX + key, self._sign(key, entry) + b"\n" + entry)

    def claim(self, key: str, ttl_s: float) -> bytes | None:
        """Take the cluster-wide claim on compiling `key` (expiring after `ttl_s`, so a
        machine that dies releases it); its token, None where another process holds it.
        An unreachable server gives the claim: the local cache goes on alone."""
        token = secrets.token_hex(8).encode()
        if self._failed:
            return token
        taken = self._call("set", REDIS_LOCK_PREFIX + key, token, nx=True, px=max(1, int(ttl_s * 1000)))
        return token if taken or self._failed else None

    def renew(self, key: str, token: bytes, ttl_s: float) -> None:
        """Extend our claim on `key` to `ttl_s` from now (only while it is still ours)."""
        self._call("eval", "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], "
                           "ARGV[2]) end return 0", 1, REDIS_LOCK_PREFIX + key, token, max(1, int(ttl_s * 1000)))

    def claimed(self, key: str) -> bool:
        return bool(self._call("exists", REDIS_LOCK_PREFIX + key))

    def release(self, key: str, token: bytes) -> None:
        # Only the claim's owner deletes it (a claim that expired may belong to another process by now).
        self._call("eval", "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end "
                           "return 0", 1, REDIS_LOCK_PREFIX + key, token)

    def _call(self, method: str, *args, **kwargs):
        if self._failed:
            return None
        import redis

        try:
            return getattr(self._client, method)(*args, **kwargs)
        except redis.RedisError as error:
            self._failed = True  # one warning, then the local cache alone
            log.warning("tori: shared compile cache %s unreachable (%s); using the local cache only", self.url, error)
            return None


# A claim in Redis lives this long unless its holder renews it, which it does every
# third of it while it compiles: a machine that dies mid-compile holds up the others
# for at most this long (not their whole cache_wait_s).
CLAIM_TTL_S = 15.0


class _Renewal:
    """Renews a claim in Redis from a thread of its own until stopped."""

    def __init__(self, shared: RedisCache, key: str, token: bytes):
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(shared, key, token), daemon=True,
                                        name=f"tori-claim-{key[:8]}")
        self._thread.start()

    def _run(self, shared: RedisCache, key: str, token: bytes) -> None:
        while not self._stopped.wait(CLAIM_TTL_S / 3):
            shared.renew(key, token, CLAIM_TTL_S)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)


# --- the cache a compile uses -----------------------------------------------

class CompileCache:
    """The local cache, and the shared one above it when configured."""

    def __init__(self, local: DiskCache, shared: RedisCache | None = None):
        self.local = local
        self.shared = shared

    def get(self, key: str) -> dict[Target, bytes] | None:
        found = self.read(key)
        if found is None:
            counters.cache_misses += 1
            return None
        counters.cache_hits += 1
        return found[0]

    def read(self, key: str) -> tuple[dict[Target, bytes], dict] | None:
        """The entry under `key` (vmfbs and metadata), locally or else from the shared
        cache (then kept locally); not counted."""
        found = self.local.read(key)
        if found is None and self.shared is not None:
            entry = self.shared.get(key)
            if entry is not None:
                try:
                    found = read_entry(key, entry)
                except CorruptEntry as error:
                    log.warning("tori: shared compile cache entry %s is corrupted (%s); recompiling", key, error)
                    counters.cache_corrupt += 1
                else:
                    self._put_local(key, entry)
        return found

    @contextmanager
    def single_flight(self, key: str, wait_s: float) -> Iterator[dict[Target, bytes] | None]:
        """The vmfbs under `key`, or None: then the caller compiles them and `put`s them
        inside the `with`, while other processes asking for `key` wait (up to `wait_s`)
        and are then served its entry. Processes sharing the local directory coordinate
        through a file lock, machines sharing the Redis cache through a claim in Redis.
        A waiter whose wait runs out (a compile longer than `wait_s`) compiles itself.
        Counted as one hit or one miss; `cache_waits` counts the hits that waited."""
        found = self.read(key)
        if found is not None:
            counters.cache_hits += 1
            yield found[0]
            return
        start = time.monotonic()
        with self.local.compiling(key, wait_s) as (held, waited_locally):
            # Compiled by the process that held the lock?
            found = self.read(key) if waited_locally else None
            token = None
            if found is None and held and self.shared is not None:
                token, waited_shared = self._claim_shared(key, max(0.0, wait_s - (time.monotonic() - start)))
                found = self.read(key) if waited_shared else None
            waited = time.monotonic() - start
            if found is not None:
                counters.cache_hits += 1
                counters.cache_waits += 1
                log.info("tori: graph %s compiled by another process; served after %.2f s", key[:16], waited)
                yield found[0]
                return
            if not held or (self.shared is not None and token is None):
                log.warning("tori: waited %.0f s for another process to compile %s (option cache_wait_s); "
                            "compiling it here too", waited, key[:16])
            counters.cache_misses += 1
            renewal = _Renewal(self.shared, key, token) if token is not None else None
            try:
                yield None
            finally:
                if renewal is not None:
                    renewal.stop()
                    self.shared.release(key, token)

    def _claim_shared(self, key: str, wait_s: float) -> tuple[bytes | None, bool]:
        """The shared cache's claim on `key` (None once the entry arrived or the wait
        ran out), waiting while another machine holds it; and whether it waited."""
        deadline, waited = time.monotonic() + wait_s, False
        while True:
            token = self.shared.claim(key, ttl_s=CLAIM_TTL_S)
            if token is not None:
                return token, waited
            waited = True
            while self.shared.claimed(key) and time.monotonic() < deadline:
                if self.shared.get(key) is not None:
                    return None, waited
                time.sleep(POLL_S)
            if time.monotonic() >= deadline or self.shared.get(key) is not None:
                return None, waited

    def put(self, key: str, vmfbs: Mapping[Target, bytes], meta: Mapping | None = None) -> None:
        entry = encode_entry(key, vmfbs, meta)
        self._put_local(key, entry)
        if self.shared is not None:
            self.shared.put(key, entry)

    def _put_local(self, key: str, entry: bytes) -> None:
        # A read-only or full cache directory costs the next process a compile, never this one its result.
        try:
            self.local.put(key, entry)
        except OSError as error:
            log.warning("tori: could not write the compile cache in %s: %s", self.local.directory, error)


_caches: dict[tuple, CompileCache] = {}
_lock = threading.Lock()


def compile_cache(options: Options) -> CompileCache | None:
    """The cache `options` name, None when off (option `cache`, TORI_CACHE=0)."""
    if not options.cache:
        return None
    secret = os.environ.get(KEY_ENV, "")
    ident = (str(options.cache_dir), options.cache_max_bytes, options.cache_url, hashlib.sha256(secret.encode()).digest())
    with _lock:
        cache = _caches.get(ident)
        if cache is None:
            shared = None
            if options.cache_url:
                if not secret:
                    from tori.errors import OptionsError

                    raise OptionsError("cache_url", options.cache_url, [],
                                       message=f"the shared compile cache {options.cache_url} needs {KEY_ENV}, the "
                                               f"secret its entries are signed with (the same on every machine)")
                shared = RedisCache(options.cache_url, secret.encode())
            cache = _caches[ident] = CompileCache(DiskCache(options.cache_dir, options.cache_max_bytes), shared)
        return cache
