"""The benchmark data: a manifest of every file the project reads, fetched from a mirror or the official sources.

    agentjax data [--mirror URL] [--only alfworld webshop textcraft textworld_sync] [--dest DIR] [--verify]
    make data DATA_ARGS="--only textcraft"

The data root (``--dest``; default ``$AGENTJAX_DATA``, else ``../shared/data`` beside the repository, the folder
``.ci/run`` and the Makefile use; the envs read it through ``envs.base.data_root``) holds the layout of
:data:`MANIFEST`: ``alfworld/json_2.1.1_<split>.tar.xz``, ``webshop/products_1k.jsonl.xz`` +
``items_ins_v2_1000.json``, ``textcraft/*.jsonl(.xz)`` + ``textcraft_synth_recipes.json``,
``textworld_sync/{training,validation,eval}/*.xz`` + ``generation_inputs/``. Each file has its sha256 (the data
folder's ``SHA256SUMS``) and, where an official source yields the same content in another container,
``content_sha256``: the sha256 of a ``.xz`` file's decompressed bytes, or of the ``sha256sum`` listing
(``<sha256>  <member>\\n``, sorted by member) of a ``.tar.xz`` archive's files.

Two sources:

- a mirror (``mirror=URL``): a base URL serving that layout (a lab's copy of the data folder, ``file:///path``, the
  tests' local server); each file is ``URL/<relative path>``.
- the official sources (the default): upstream artifacts converted into the layout, :mod:`envs.data_official`
  (which also says which official source cannot reproduce which file).

A file already present with the right hash (or content hash) is skipped; every file is written to a temporary file
in its folder and renamed into place once verified, so an interrupted run leaves no partial file and the next run
resumes; a download with the wrong hash is deleted and reported with its URL and both hashes. ``verify=True`` only
checks what is there (one file's checks, writes and downloads: :mod:`envs.data_files`). Plain Python, standard
library only; no jax.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import shutil
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envs import data_official
from envs.data_files import (
    DataError,
    DataFile,
    atomic_write,
    check,
    download,
    mismatch_error,
    remove_partials,
    sha256_file,
)

DATASETS = ("alfworld", "webshop", "textcraft", "textworld_sync")
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CACHE = ".downloads"


def _f(path: str, sha256: str, content_sha256: str | None = None) -> DataFile:
    return DataFile(path, sha256, content_sha256)


MANIFEST: tuple[DataFile, ...] = (
    _f("alfworld/json_2.1.1_train.tar.xz", "079870e4e60e2cd80ade42191e66093cc04bf42cf88c4474e34995c1b0a9103b",
       "ee760906a175326135ec138a921f28f6c58ddf690611f7638676da1409014fcd"),  # 3,553 games
    _f("alfworld/json_2.1.1_valid_seen.tar.xz", "0040a095795c0862813a1491e7e8deb18eb0920dbc48453a92670fc9daea946c",
       "2f0135d66ccefa654c5dba2148ceda1264b5ce23a8acc8aca165fcec05259a69"),  # 140
    _f("alfworld/json_2.1.1_valid_unseen.tar.xz", "1c26c1ae1af6f0b9c0542e11866c104c79e91e9e2ef61783c03a59c37a27bd46",
       "0ecd5b0bb801227149f754cb74af68e870634e0a203f9e91c52c98f5c601c025"),  # 134
    _f("alfworld/json_2.1.1_valid_train.tar.xz", "a82eaecf4b6f70b90052aa2ea6177ea192a8899e5d0e272e57f24e30de7e417c",
       "8a040e7dab1c809e77d57c6a09fe8ef9c957b13b0831c5c2b47b7e737dac0579"),  # 200
    _f("webshop/products_1k.jsonl.xz", "0840ee3bb035ba908fb321244664602d419e1d5c06b6fd5b118aca29f595867e",
       "6983a676c0a602c01eb6854680669c5be4f15bae42326d1a61b824b44590da4f"),
    _f("webshop/items_ins_v2_1000.json", "f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f"),
    _f("textcraft/textcraft_train.jsonl", "007c8df79763b80df3b17b8375839d9b22ba5d64dd079df1546de813954e542e"),
    _f("textcraft/textcraft_val.jsonl", "12252c6ea5cf4b182ba2eb7fd4217cda7490054ea4259780586a484c951ae989"),
    _f("textcraft/textcraft_synth_train.jsonl.xz", "4ffbace21185dfedeb543a2fd4633510ecfee93078048b420e7088dd2abec855",
       "685823fbca90aa89e061e61fef58d0122def4221eed14cf2c8c730341363a00f"),
    _f("textcraft/textcraft_synth_val.jsonl.xz", "1e0f20d6b8977b48532e519f4ac70f754334b56c2e7e689851f59dc43f4ef86c",
       "84a123ee46e29e65f4d7b95f4943aa56907fc3fd5992268faa749602579dfc0c"),
    _f("textcraft/textcraft_synth_recipes.json", "abe23923d4493a7228f4717f8d7d384e562b6e36299092b2fe4fa4ccf0b02788"),
    _f("textworld_sync/generation_inputs/LICENSE-textworldexpress-Apache-2.0.txt",
       "6a0e828d0d1ac33b715cbf4ce9ec9d38303497d12d199d85122e7e207624138c"),
    _f("textworld_sync/generation_inputs/cooking_world.json",
       "ecef2d85523c9801d00ddb35c77b8f56e0f9f4ef37c022e8431102c0b49522fd"),
    _f("textworld_sync/generation_inputs/textworld_v9.json",
       "64587e0982493fcebcb64300482035727f929a61714aad6f9260ec11840e3b7b"),
    _f("textworld_sync/training/textworld_multidish_train_1500_v9.json.xz",
       "7c5f40fe36c900cdc1a3d48224287c82037f84ad1c5f3007086ba3bae4ee66bb",
       "0aca7a6f8935eaaa2983aa3352bba9df30474c16506a3c8cf51ab4e6fd1cd3a5"),
    _f("textworld_sync/training/textworld_train.jsonl.xz",
       "f0a7762221925cc22fbb1499560a5d225260e263310d9bbb92ba58ab8e594542",
       "73c76930246fe51601319313fd89b4e965b28d3cf99541735ac8a47cbeb1147a"),
    _f("textworld_sync/validation/textworld_dev.jsonl.xz",
       "915522d56bc6ad99b508c1fe1d4d27ce3ce04ff66d817393985153c10282d00c",
       "b7ce860612c1eb848f1680bc08b6eda61433cafb029e9b9e3ac9a15b7c754d30"),
    _f("textworld_sync/validation/textworld_multidish_validation_200_v9.json.xz",
       "6c9089ae43cc11c14cca19dc2404572a0dd3a7d5e7dc97843d9c72512148b347",
       "1a0553e08ce3fb25bd597ffbbbb1a8140f93c277f13c9f284a3d16a22105f59a"),
    _f("textworld_sync/eval/textworld_multidish_test_1400_v9.json.xz",
       "42341efd53868079f36a4bc3b2fa356b16e893776d69cc5fecc48b0c60242d96",
       "3d509f5a988d1acd3f5a538f174da8c43235a77d4f09f6120d100b25fba47696"),
    _f("textworld_sync/eval/textworld_test.jsonl.xz",
       "8d4d31c45607b478198691311f92a4ad8b823b88f5463f5c519006558da45fae",
       "9478b98ff583ffb6d53f4c4393ab3d4bd1a9edcb82630b36e5ac9a0b217f27a0"),
)


@dataclasses.dataclass(frozen=True)
class Result:
    path: str
    status: str  # "downloaded" | "already present" | "verified" | "missing" | "failed"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status not in ("failed", "missing")

    def line(self) -> str:
        return f"{self.path}: {self.status}" + (f" ({self.detail})" if self.detail else "")


def default_root() -> pathlib.Path:
    """``$AGENTJAX_DATA``, else ``../shared/data`` beside the repository (the Makefile's default)."""
    value = os.environ.get("AGENTJAX_DATA")
    return pathlib.Path(value).expanduser() if value else (REPO_ROOT / ".." / "shared" / "data").resolve()


# -- a mirror ----------------------------------------------------------------------------------------------------------
def fetch_from_mirror(file: DataFile, base: str, target: pathlib.Path) -> str:
    """Downloads ``base/<file.path>`` onto ``target`` when its hash is right; returns what was checked."""
    url = base.rstrip("/") + "/" + urllib.parse.quote(file.path)
    with atomic_write(target) as tmp:
        download(url, tmp)
        how = check(file, tmp)
        if how is None:
            raise mismatch_error(file.path, url, file.sha256, sha256_file(tmp))
    return f"{how} verified, from {url}"


# -- the run ------------------------------------------------------------------------------------------------------
STATUSES = ("downloaded", "already present", "verified", "missing", "failed")


def fetch(dest: str | os.PathLike | None = None, *, only: Sequence[str] | None = None, mirror: str | None = None,
          verify: bool = False, files: Sequence[DataFile] = MANIFEST, artifacts: Mapping[str, Any] | None = None,
          recipes: Mapping[str, Any] | None = None, log: Callable[[str], None] | None = None) -> list[Result]:
    """Makes (or with ``verify`` only checks) the files of the ``only`` datasets under ``dest``; one result each.

    ``mirror`` is a base URL serving the layout; without it the official sources are used. ``files``,
    ``artifacts`` and ``recipes`` default to the real manifest and :mod:`envs.data_official`'s sources (the tests
    pass small ones). ``log`` receives progress lines and each result's line as soon as it is known. Upstream
    artifacts are cached under ``<dest>/.downloads`` during the run and removed at its end (an interrupted run
    leaves them for the next one).
    """
    log = log or (lambda line: None)
    unknown = sorted(set(only or ()) - set(DATASETS))
    if unknown:
        raise ValueError(f"unknown dataset(s) {unknown}; choose from {list(DATASETS)}")
    root = pathlib.Path(dest).expanduser() if dest is not None else default_root()
    get = data_official.Artifacts(root / CACHE, data_official.ARTIFACTS if artifacts is None else artifacts, log)
    recipes = data_official.RECIPES if recipes is None else recipes
    results = []
    for file in files:
        if only and file.dataset not in only:
            continue
        target = root / file.path
        if verify:
            result = _verify(file, target)
        else:
            produce = (functools.partial(fetch_from_mirror, file, mirror, target) if mirror else
                       functools.partial(data_official.fetch_official, file, target, get, recipes))
            result = _make(file, target, produce)
        log(result.line())
        results.append(result)
    if not verify:
        shutil.rmtree(root / CACHE, ignore_errors=True)
    return results


def _verify(file: DataFile, target: pathlib.Path) -> Result:
    if not target.is_file():
        return Result(file.path, "missing", f"no {target}")
    how = check(file, target)
    if how:
        return Result(file.path, "verified", how)
    return Result(file.path, "failed", f"sha256 mismatch: expected {file.sha256}, got {sha256_file(target)}")


def _make(file: DataFile, target: pathlib.Path, produce: Callable[[], str]) -> Result:
    replaced = ""
    try:
        if target.is_file():
            how = check(file, target)
            if how:
                return Result(file.path, "already present", f"{how} verified")
            replaced = f"replaced a copy with sha256 {sha256_file(target)}; "
        remove_partials(target)
        return Result(file.path, "downloaded", replaced + produce())
    except DataError as e:
        return Result(file.path, "failed", str(e))
    except OSError as e:  # a read-only or full destination
        return Result(file.path, "failed", f"cannot write {target}: {e}")


def summary(results: Sequence[Result]) -> str:
    """One line per dataset: how many files ended in each status."""
    lines = []
    for dataset in DATASETS:
        mine = [r for r in results if r.path.split("/", 1)[0] == dataset]
        if mine:
            counts = ", ".join(f"{n} {status}" for status in STATUSES if (n := sum(r.status == status for r in mine)))
            lines.append(f"{dataset}: {len(mine)} file{'s' * (len(mine) != 1)}: {counts}")
    return "\n".join(lines)
