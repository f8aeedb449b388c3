"""One file of the benchmark data: what it is (:class:`DataFile`), how it is checked (sha256, or the sha256 of its
content in another container) and how it is fetched safely (atomic writes, downloads whose failures name the URL and
the hashes). What the run (:mod:`envs.data`) and the official sources (:mod:`envs.data_official`) share. Plain
Python, standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import lzma
import os
import pathlib
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator

TIMEOUT_S = 60.0
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class DataFile:
    """One file of the documented layout."""

    path: str  # relative to the data root, e.g. "alfworld/json_2.1.1_train.tar.xz"
    sha256: str  # of the file itself (the data folder's SHA256SUMS)
    content_sha256: str | None = None  # of its content: decompressed .xz bytes, or a .tar.xz's sha256sum listing

    @property
    def dataset(self) -> str:
        return self.path.split("/", 1)[0]


class DataError(Exception):
    """One file could not be fetched or verified; the message names the file, the URL and the hashes."""


# -- hashes -------------------------------------------------------------------------------------------------------
def sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def listing_sha256(rows: Iterable[tuple[str, str]]) -> str:
    """sha256 of the ``sha256sum`` listing of ``(member name, member sha256)`` rows, sorted by name."""
    return hashlib.sha256("".join(f"{digest}  {name}\n" for name, digest in sorted(rows)).encode()).hexdigest()


def content_sha256(path: pathlib.Path, name: str | None = None) -> str | None:
    """The content hash of a ``.tar.xz`` (its files' listing) or ``.xz`` (its decompressed bytes); None for other
    files and unreadable ones. ``name`` (default: the path's) says which kind the file is."""
    name = name or path.name
    try:
        if name.endswith(".tar.xz"):
            with tarfile.open(path, "r:xz") as tar:
                return listing_sha256((m.name, hashlib.sha256(tar.extractfile(m).read()).hexdigest())
                                      for m in tar if m.isfile())
        if name.endswith(".xz"):
            digest = hashlib.sha256()
            with lzma.open(path) as f:
                for chunk in iter(lambda: f.read(_CHUNK), b""):
                    digest.update(chunk)
            return digest.hexdigest()
    except (lzma.LZMAError, tarfile.TarError, EOFError, OSError):
        return None
    return None


def check(file: DataFile, path: pathlib.Path) -> str | None:
    """``"sha256"`` or ``"content sha256"`` when ``path`` is ``file`` (the second: same content, other container)."""
    if sha256_file(path) == file.sha256:
        return "sha256"
    if file.content_sha256 and content_sha256(path, file.path) == file.content_sha256:
        return "content sha256"
    return None


# -- downloads ----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_write(target: pathlib.Path) -> Iterator[pathlib.Path]:
    """A temporary path beside ``target``, renamed onto it on success and deleted on any failure."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    os.close(fd)
    tmp = pathlib.Path(name)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def remove_partials(target: pathlib.Path) -> None:
    """Temporary files of an interrupted run (``atomic_write`` names)."""
    if target.parent.is_dir():
        for leftover in target.parent.glob(f".{target.name}.*.part"):
            leftover.unlink(missing_ok=True)


def download(url: str, out: pathlib.Path, *, timeout: float = TIMEOUT_S) -> None:
    """Streams ``url`` into ``out``; a web page where a data file was expected (a sign-in or quota page) is an error."""
    request = urllib.request.Request(url, headers={"User-Agent": "agentjax-data/1"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response, open(out, "wb") as f:
            html = "text/html" in response.headers.get("Content-Type", "")
            first = response.read(_CHUNK)
            if html or first.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")):
                raise DataError(f"{url} answered with a web page, not the file (a Google Drive quota or sign-in "
                                "page, or a moved file)")
            f.write(first)
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                f.write(chunk)
    except urllib.error.HTTPError as e:
        raise DataError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as e:
        reason = getattr(e, "reason", e)
        raise DataError(f"{url} is not reachable: {reason}") from None


def mismatch_error(what: str, url: str, expected: str, actual: str) -> DataError:
    return DataError(f"sha256 mismatch for {what} from {url}: expected {expected}, got {actual}; not kept")
