"""Where data lives: local paths and fsspec URLs (``s3://``, ``gs://``, ``az://``, ``hf://``, ``https://``,
``memory://``), behind one small set of file operations that the rest of weightprep calls.

A local path goes to ``os``/``open`` exactly as before; a URL goes to the fsspec filesystem of its protocol,
made with the options in effect on top of the usual credentials (environment, profiles, ``AWS_ENDPOINT_URL``...):
those of the enclosing ``session`` (``build(storage_options=...)``, ``load_shards(storage_options=...)``: one call's,
a ContextVar), else the process's (``configure``: ``--storage-options``). A session also keeps the metadata its
listings found (a glob or a prefix is listed once, with sizes and ETags), so the checks, the plan, the resume key and
the workers (which get the driver's metadata with their job) ask the store nothing more per object. A protocol whose package is missing is a ``UsageError`` that names the
``pip install 'weightprep[EXTRA]'`` line.

Reads are ranged: ``open_input(url, start, end)`` reads bytes ``start .. end`` of an object with range requests
(``cache_type="none"``: no read-ahead past ``end``), in ``CHUNK`` bytes at most per request, so a worker fetches
its part of an input and nothing else. Every store operation is retried on transient errors (connection dropped,
timeouts, 5xx: anything but not-found, permission and bad-argument errors) ``retries()`` times with exponential
backoff (``WEIGHTPREP_STORAGE_RETRIES``, default 5; ``WEIGHTPREP_STORAGE_BACKOFF`` seconds, default 1, doubled
at each try); a read resumes at the byte it had reached, so the bytes are the same. Then ``StorageError`` names
the object and the operation.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from weightprep.errors import UsageError, WeightprepError
from weightprep.redact import redact, remember, remember_options

__all__ = [
    "StorageError", "is_url", "read_fresh", "download_tree", "configure", "session", "parse_options", "current_options", "options_for", "filesystem", "join", "size",
    "exists", "isfile", "isdir", "known_metadata", "glob", "listdir", "read_text", "open_input", "open_text", "stat_key", "put_file",
    "write_bytes", "copy", "remove", "remove_tree", "names_under", "find", "arrow_filesystem", "retry", "protocol",
]

_URL = re.compile(r"^(?P<protocol>[A-Za-z][A-Za-z0-9+.-]+)://")
#: The extra that installs each protocol's filesystem (``pip install 'weightprep[EXTRA]'``).
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "hf": "hf", "az": "azure", "abfs": "azure",
          "abfss": "azure", "http": "http", "https": "http"}
#: The package each extra installs (to tell a missing one from a protocol fsspec does not know).
EXTRA_PACKAGES = {"s3": "s3fs", "gcs": "gcsfs", "azure": "adlfs", "hf": "huggingface_hub", "http": "aiohttp"}
#: Protocols that can be read but not written.
READ_ONLY = ("http", "https")
#: The most bytes one ranged read asks for.
CHUNK = 8 << 20

T = TypeVar("T")


class StorageError(UsageError):
    """A store operation failed for good: after the retries of a transient error, or at once for a persistent one."""


#: The process's options (``configure``: the command line's ``--storage-options``), used outside any ``session``.
_DEFAULT: dict[str, Any] = {}


@dataclass
class _Session:
    """The storage options of a scope (a ``build()`` call, a part's job) and the metadata of the objects its
    listings and lookups found (URL -> fsspec info of a file), so each input costs no request beyond the listing
    that found it (or one lookup, if it was named) and its reads."""

    options: dict[str, Any]
    known: dict[str, dict[str, Any]] = field(default_factory=dict)


# a ContextVar, not a global: two build() calls with other options (one after the other, or in two threads) do not
# see each other's; the build's own threads run in a copy of its context (weightprep.overlap)
_SESSION: ContextVar[_Session | None] = ContextVar("weightprep_storage_session", default=None)


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and _URL.match(path) is not None


def protocol(url: str) -> str:
    m = _URL.match(url)
    return m["protocol"].lower() if m else "file"


def parse_options(options: dict[str, Any] | str | None) -> dict[str, Any]:
    """Storage options as a dict, from a dict, a JSON object (``--storage-options``) or None (no options)."""
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except ValueError as exc:
            raise UsageError(f"--storage-options: not valid JSON ({exc}); e.g. '{{\"endpoint_url\": \"http://...\"}}'") from None
    if options is not None and not isinstance(options, dict):
        raise UsageError(f"--storage-options: expected a JSON object, got {type(options).__name__}")
    return dict(options or {})


def configure(options: dict[str, Any] | str | None) -> None:
    """Set this process's storage options (``--storage-options``: a JSON object), used outside any ``session``.
    Keys that name a protocol (``{"s3": {...}, "hf": {...}}``) apply to that protocol only; every other key applies
    to every URL. Library code passes ``storage_options=`` to ``build()``/``load_shards()`` instead (``session``)."""
    global _DEFAULT
    _DEFAULT = parse_options(options)
    remember_options(_DEFAULT)


@contextlib.contextmanager
def session(
    options: dict[str, Any] | str | None = None, known: dict[str, dict[str, Any]] | None = None
) -> Iterator[None]:
    """A scope with its own storage options (``options``; None: those in effect, from an enclosing session or
    ``configure``) and its own metadata cache. Nested with None, it is the enclosing session itself, cache
    included (the command line's listing of the inputs is its build's). Within a session objects are taken as
    unchanged, as a build takes its inputs (its resume key assumes it too); what this process writes or removes is
    forgotten. ``known``: metadata the session starts with (``known_metadata`` of the driver's, in a worker)."""
    outer = _SESSION.get()
    if options is None and known is None and outer is not None:
        yield
        return
    token = _SESSION.set(
        _Session(parse_options(options) if options is not None else current_options(), dict(known or {}))
    )
    remember_options(_SESSION.get().options)  # type: ignore[union-attr]
    try:
        yield
    finally:
        _SESSION.reset(token)


def current_options() -> dict[str, Any]:
    """The options in effect: the enclosing ``session``'s, else the process's (``configure``)."""
    s = _SESSION.get()
    return dict(s.options if s is not None else _DEFAULT)


def options_for(proto: str) -> dict[str, Any]:
    """The options a filesystem of ``proto`` is made with (``session``, ``configure``)."""
    import fsspec

    names = set(fsspec.available_protocols())
    options = current_options()
    common = {k: v for k, v in options.items() if not (k in names and isinstance(v, dict))}
    specific = options.get(proto)
    return {**common, **(specific if isinstance(specific, dict) else {})}


def _missing(url: str, proto: str, exc: Exception) -> UsageError:
    extra = EXTRAS.get(proto)
    fix = f"pip install 'weightprep[{extra}]'" if extra else "install the fsspec filesystem package of this protocol"
    return UsageError(f"{redact(url)}: {proto}:// needs a package that is not installed ({exc}): {fix}")


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path in it."""
    import fsspec

    remember(url)  # whatever a library echoes of it later is masked (weightprep.redact)
    proto = protocol(url)
    try:
        fsspec.get_filesystem_class(proto)
    except ImportError as exc:
        raise _missing(url, proto, exc) from None
    except ValueError:
        import importlib.util

        extra = EXTRAS.get(proto)
        if extra is not None and importlib.util.find_spec(EXTRA_PACKAGES[extra]) is None:
            # fsspec registers some protocols (abfss://) only once their package is installed
            raise _missing(url, proto, ImportError(f"{EXTRA_PACKAGES[extra]} is not installed")) from None
        raise UsageError(f"{redact(url)}: unknown protocol {proto}:// (known: s3, gs, az, hf, https, memory, ...)") from None
    try:
        return fsspec.core.url_to_fs(url, **options_for(proto))  # type: ignore[no-any-return]
    except ImportError as exc:
        raise _missing(url, proto, exc) from None


def join(base: str | Path, *names: str) -> Any:
    """``base/names...``: a Path for a local ``base`` (Path or str), a URL string for a URL."""
    if is_url(base):
        return "/".join([str(base).rstrip("/"), *(n.strip("/") for n in names)])
    return Path(base).joinpath(*names)


def _url(fs: Any, path: str, like: str) -> str:
    """``path`` of ``fs`` as a URL spelled like ``like`` (``memory://a`` stays ``memory://a``, not ``memory:///a``)."""
    proto = protocol(like)
    return f"{proto}://{path.lstrip('/') if like[len(proto) + 3 :][:1] != '/' else path}"


# ---- retries ---------------------------------------------------------------------------------------------------

_PERSISTENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError,
               ValueError, TypeError, KeyError, WeightprepError)
_TRANSIENT_MODULES = ("aiohttp", "botocore", "urllib3", "requests", "http", "google", "huggingface_hub", "azure",
                      "fsspec", "s3fs", "gcsfs", "adlfs", "ssl", "socket", "asyncio")


#: Errors of the stores' client libraries that no retry can fix (botocore's, by name: no import of botocore here):
#: a request that is invalid as written (``Invalid bucket name``), credentials or a region that are missing.
_PERSISTENT_NAMES = frozenset({
    "ParamValidationError", "NoCredentialsError", "PartialCredentialsError", "NoRegionError", "InvalidRegionError",
    "UnknownServiceError", "InvalidEndpointConfigurationError", "InvalidS3AddressingStyleError", "UnknownSignatureVersionError",
})


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, _PERSISTENT) or any(c.__name__ in _PERSISTENT_NAMES for c in type(exc).__mro__):
        return False
    if isinstance(exc, (OSError, ConnectionError, TimeoutError, EOFError)):
        return True  # s3fs/gcsfs turn a 5xx or a dropped connection into an OSError
    return type(exc).__module__.split(".")[0] in _TRANSIENT_MODULES


def retries() -> int:
    return max(0, int(os.environ.get("WEIGHTPREP_STORAGE_RETRIES", "5")))


def _backoff(attempt: int) -> float:
    return float(os.environ.get("WEIGHTPREP_STORAGE_BACKOFF", "1")) * 2**attempt


def _failed(url: str, what: str, exc: BaseException, attempts: int) -> StorageError:
    tries = f" after {attempts} tries with backoff" if attempts > 1 else ""
    return StorageError(
        f"{redact(url)}: {what} failed{tries} ({type(exc).__name__}: {redact(str(exc))}); check the store, the object and the "
        "credentials (--storage-options), then build again (--resume keeps the finished parts)"
    )


def retry(fn: Callable[[], T], url: str, what: str) -> T:
    """``fn()``, tried again on transient errors with exponential backoff; then ``StorageError`` naming ``url``."""
    attempt = 0
    while True:
        try:
            return fn()
        except BaseException as exc:
            if not isinstance(exc, Exception) or isinstance(exc, StorageError):
                raise
            if isinstance(exc, FileNotFoundError):
                raise StorageError(f"{redact(url)}: not found ({what})") from None
            if not _transient(exc) or attempt >= retries():
                raise _failed(url, what, exc, attempt + 1) from None
            time.sleep(_backoff(attempt))
            attempt += 1


# ---- metadata -------------------------------------------------------------------------------------------------


def _remember(url: str, info: dict[str, Any]) -> None:
    """Keep a file's metadata for the rest of the session (``session``)."""
    s = _SESSION.get()
    if s is not None and info.get("type") == "file":
        s.known[url.rstrip("/")] = info


def _forget(url: str) -> None:
    """Drop what the session knows of ``url`` and of everything under it (this process wrote or removed it)."""
    s = _SESSION.get()
    if s is not None:
        key = url.rstrip("/")
        for k in [k for k in s.known if k == key or k.startswith(key + "/")]:
            del s.known[k]


#: The fields of an object's metadata a worker needs (its size, and the version s3fs checks its reads against).
_VERSION_KEYS = ("ETag", "etag", "generation", "VersionId", "mtime", "LastModified", "last_modified", "created")


def known_metadata(urls: list[str]) -> dict[str, dict[str, Any]]:
    """What this session knows of ``urls`` (from its listings and lookups), for a worker's session to start with:
    the fields a worker uses only, so that the job stays small for many thousands of objects."""
    s = _SESSION.get()
    found = {u.rstrip("/"): s.known.get(u.rstrip("/")) for u in urls if is_url(u)} if s is not None else {}
    keep = ("name", "size", "type", *_VERSION_KEYS)
    return {u: {k: info[k] for k in keep if k in info} for u, info in found.items() if info is not None}


def _lookup(url: str) -> dict[str, Any] | None:
    """The fsspec info of ``url`` (None if there is no such object or prefix): from the session's listings and
    lookups where it is there, else one metadata request (retried)."""
    s = _SESSION.get()
    if s is not None and (known := s.known.get(url.rstrip("/"))) is not None:
        return known
    fs, path = filesystem(url)

    def info() -> dict[str, Any] | None:
        try:
            return fs.info(path)  # type: ignore[no-any-return]
        except FileNotFoundError:
            return None

    found = retry(info, url, "reading its metadata")
    if found is not None:
        _remember(url, found)
    return found


def _info(url: str) -> dict[str, Any]:
    found = _lookup(url)
    if found is None:
        raise StorageError(f"{redact(url)}: not found (reading its metadata)")
    return found


def size(path: str | Path) -> int:
    if not is_url(path):
        return os.path.getsize(path)
    return int(_info(str(path))["size"])


def exists(path: str | Path) -> bool:
    if not is_url(path):
        return os.path.exists(path)
    return _lookup(str(path)) is not None


def isfile(path: str | Path) -> bool:
    if not is_url(path):
        return os.path.isfile(path)
    found = _lookup(str(path))
    return found is not None and found.get("type") == "file"


def isdir(path: str | Path) -> bool:
    if not is_url(path):
        return os.path.isdir(path)
    found = _lookup(str(path))
    return found is not None and found.get("type") == "directory"


def stat_key(path: str) -> list[Any]:
    """What tells an unchanged input (``--resume``): its size and its version (ETag, generation or mtime), from the
    listing that found it where there was one (the same fields as a lookup's)."""
    if not is_url(path):
        st = os.stat(path)
        return [os.path.abspath(path), st.st_size, st.st_mtime_ns]
    info = _info(path)
    version = next((str(info[k]) for k in _VERSION_KEYS if info.get(k) is not None), None)
    return [path, int(info["size"]), version]


def glob(pattern: str) -> list[str]:
    """The URLs matching a glob URL, sorted; as a shell's glob, ``*`` does not match a name starting with a dot."""
    fs, p = filesystem(pattern)
    hidden = pattern.rstrip("/").rsplit("/", 1)[-1].startswith(".")
    # one listing with sizes and versions (detail=True): the plan and the resume key ask no more of these objects
    found = retry(lambda: fs.glob(p, detail=True), pattern, "listing the glob")
    urls = []
    for m, info in found.items():
        if hidden or not m.rstrip("/").rsplit("/", 1)[-1].startswith("."):
            urls.append(_url(fs, m, pattern))
            _remember(urls[-1], info)
    return sorted(urls)


def listdir(url: str) -> list[str]:
    """The URLs of the files directly under ``url``, sorted."""
    fs, p = filesystem(url)
    entries = retry(lambda: fs.ls(p, detail=True), url, "listing it")
    urls = []
    for e in entries:
        if e.get("type") == "file":
            urls.append(_url(fs, e["name"], url))
            _remember(urls[-1], e)
    return sorted(urls)


def find(url: str) -> dict[str, int]:
    """Every object under the prefix ``url`` (recursively): URL -> size."""
    fs, p = filesystem(url)
    fs.invalidate_cache(p)  # another process may have written there since this one listed it (s3fs caches listings)
    if not retry(lambda: fs.exists(p), url, "checking that it exists"):
        return {}
    found = retry(lambda: fs.find(p, detail=True), url, "listing it")
    return {_url(fs, name, url): int(info.get("size") or 0) for name, info in sorted(found.items())}


# ---- reading --------------------------------------------------------------------------------------------------


class _RangeFile(io.RawIOBase):
    """Bytes ``start .. end`` of an object, read with range requests of at most ``chunk`` bytes and never past
    ``end``; a failed read is retried from the byte it had reached (``retry``), on a file opened anew."""

    def __init__(
        self, url: str, start: int = 0, end: int | None = None, chunk: int = CHUNK, located: tuple[Any, str] | None = None
    ) -> None:
        self.url, self._start, self._pos, self._chunk = url, start, start, chunk
        self._fs, self._path = located if located is not None else filesystem(url)
        self._end = end if end is not None else size(url)
        self._f: Any = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos - self._start

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: self._start, 1: self._pos, 2: self._end}[whence]
        self._pos = max(self._start, base + offset)
        return self.tell()

    def _fetch(self, n: int) -> bytes:
        if self._f is None:
            self._f = self._open()
        self._f.seek(self._pos)
        data = self._f.read(n)
        if len(data) < n:  # n never reaches past the range's end: fewer bytes is a read cut short
            raise EOFError(f"short read: {len(data)} of {n} bytes at {self._pos}")
        return data  # type: ignore[no-any-return]

    def _open(self) -> Any:
        from fsspec.spec import AbstractBufferedFile

        # size: the file ends, for its reads, where this range does, and s3fs/gcsfs/http do not ask the store for
        # the object's size again (a HEAD per open); the details the listing found (its ETag) stand for the ones
        # s3fs would otherwise ask for at the first read
        try:
            f = self._fs.open(self._path, "rb", cache_type="none", size=self._end)
        except TypeError:  # a filesystem whose files take no size: it looks it up itself
            return self._fs.open(self._path, "rb", cache_type="none")
        s = _SESSION.get()
        known = s.known.get(self.url.rstrip("/")) if s is not None else None
        if known is not None and isinstance(f, AbstractBufferedFile):
            f.details = known
        return f

    def _reset(self) -> None:
        if self._f is not None:
            with contextlib.suppress(Exception):  # the connection is being replaced anyway
                self._f.close()
            self._f = None

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._end - self._pos, self._chunk)
        if n <= 0:
            return 0

        def attempt() -> bytes:
            try:
                return self._fetch(n)
            except BaseException:
                self._reset()
                raise

        data = retry(attempt, self.url, f"reading bytes {self._pos}..{self._pos + n}")
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        self._reset()
        super().close()


def open_input(path: str | Path, start: int = 0, end: int | None = None) -> Any:
    """A binary stream of bytes ``start .. end`` of ``path`` (a local file, or an object read by range requests)."""
    if not is_url(path):
        f = open(path, "rb")  # noqa: SIM115 - the caller closes it
        f.seek(start)
        return f
    return _RangeFile(str(path), start, end)


def open_text(path: str | Path) -> Any:
    """A text stream (UTF-8, newlines kept as they are) of a whole file or object."""
    if not is_url(path):
        return open(path, encoding="utf-8", newline="\n")  # noqa: SIM115 - the caller closes it
    return io.TextIOWrapper(io.BufferedReader(_RangeFile(str(path)), 1 << 20), encoding="utf-8", newline="\n")


def read_fresh(url: str) -> bytes | None:
    """The whole object ``url`` as the store has it now (None: there is none), past every cache: for what another
    process may have written, or removed, since this one last looked (a killed build's commit)."""
    fs, p = filesystem(url)
    _forget(url)
    fs.invalidate_cache(p)

    def cat() -> bytes | None:
        try:
            return fs.cat_file(p)  # type: ignore[no-any-return]
        except FileNotFoundError:
            return None

    return retry(cat, url, "reading it")


def download_tree(url: str, local: Path) -> None:
    """Copy every object under the prefix ``url`` into the local directory ``local``, key by key (literal names:
    fsspec's recursive ``get`` would expand glob characters in ``url``)."""
    fs, _ = filesystem(url)
    for key in find(url):
        target = local / key[len(url.rstrip("/")) + 1 :]
        target.parent.mkdir(parents=True, exist_ok=True)
        retry(lambda key=key, target=target: fs.get_file(filesystem(key)[1], str(target)), key, "downloading it")


def read_text(path: str | Path) -> str:
    with open_text(path) as f:
        return f.read()  # type: ignore[no-any-return]


def iter_chunks(path: str | Path, chunk: int = 1 << 20) -> Iterator[bytes]:
    with open_input(path) as f:
        yield from iter(lambda: f.read(chunk), b"")


def arrow_filesystem(url: str) -> tuple[Any, str]:
    """A pyarrow filesystem for ``url`` (fsspec's, through ``pyarrow.fs.FSSpecHandler``) whose input files read
    by ranges with retries; and the path in it. Parquet files are read by row group through it."""
    import pyarrow as pa
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    fs, path = filesystem(url)

    class Handler(FSSpecHandler):  # type: ignore[misc]
        def open_input_file(self, p: str) -> Any:
            # the filesystem made here, with this session's options: pyarrow may call from its own threads
            return pa.PythonFile(_RangeFile(_url(fs, p, url), chunk=1 << 62, located=(fs, p)), mode="r")

    return PyFileSystem(Handler(fs)), path


# ---- writing --------------------------------------------------------------------------------------------------


def _writable(url: str) -> tuple[Any, str]:
    if protocol(url) in READ_ONLY:
        raise UsageError(f"{redact(url)}: {protocol(url)}:// is read-only; write the output to a store (s3://, gs://, ...) or disk")
    fs, p = filesystem(url)
    if protocol(url) in ("file", "local"):
        # a store has no directories; a local disk does, and fsspec's LocalFileSystem does not make them by default
        retry(lambda: fs.makedirs(fs._parent(p), exist_ok=True), url, "making its directory")
    return fs, p


def put_file(local: str | Path, url: str) -> None:
    fs, p = _writable(url)
    _forget(url)
    retry(lambda: fs.put_file(str(local), p), url, f"uploading {local}")


def write_bytes(url: str, data: bytes) -> None:
    fs, p = _writable(url)
    _forget(url)
    retry(lambda: fs.pipe_file(p, data), url, "writing it")


def copy(src: str, dst: str) -> None:
    """Copy one object to one key within its store (server-side where the store can). Both names are literal: no
    glob character in them is expanded (fsspec's ``copy`` would expand them; ``cp_file`` does not)."""
    fs, p = _writable(dst)
    _, q = filesystem(src)
    _forget(dst)
    retry(lambda: fs.cp_file(q, p), dst, f"copying {redact(src)} to it")


def remove(url: str) -> None:
    """Remove the one object ``url`` (a literal name: fsspec's ``rm`` would expand glob characters in it; its
    ``rm_file`` does not); a missing one is not an error."""
    fs, p = _writable(url)
    _forget(url)

    def rm() -> None:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(p)

    retry(rm, url, "removing it")


def remove_tree(url: str) -> list[str]:
    """Remove every object under the prefix ``url``: the exact keys a listing found, one by one (never a pattern,
    never a key of a sibling prefix that shares the name's start: ``out`` is not ``out2``). Returns the URLs
    removed. A filesystem with directories (``file://``, ``memory://``) loses the empty ones under ``url`` too;
    a store has none."""
    found = list(find(url))
    for key in found:
        remove(key)
    fs, p = filesystem(url)
    if protocol(url) in ("file", "local"):
        for root, _dirs, _files in sorted(os.walk(p), key=lambda t: -len(t[0])):  # deepest first
            with contextlib.suppress(OSError):
                os.rmdir(root)
    elif protocol(url) == "memory":
        for d in sorted((d for d in fs.pseudo_dirs if d == p.rstrip("/") or d.startswith(p.rstrip("/") + "/")),
                        key=len, reverse=True):
            with contextlib.suppress(OSError):
                fs.rmdir(d)
    _forget(url)
    return found


#: Protocols whose first path component is a bucket (or container) that must exist before anything is written.
BUCKETED = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")


def names_under(url: str) -> list[str]:
    """The names (not URLs) directly under the prefix ``url``, files and prefixes alike, sorted: a literal listing
    for callers that match names themselves (never a glob). A missing prefix has none; a missing bucket is an
    error that says so."""
    fs, p = filesystem(url)

    def ls() -> list[str]:
        fs.invalidate_cache(p)  # fresh: what other processes left there is what the caller looks for
        try:
            return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(p, detail=False)]
        except FileNotFoundError:
            return []

    names = retry(ls, url, "listing it")
    if not names and protocol(url) in BUCKETED:
        bucket = p.strip("/").split("/", 1)[0]
        if not retry(lambda: fs.exists(bucket), url, "checking that its bucket exists"):
            raise UsageError(
                f"{redact(url)}: the bucket {bucket} does not exist, or these credentials cannot see it: create it "
                "first, or check --storage-options"
            )
    return sorted(names)
