"""Unpack the ALFWorld game archives into an ``$ALFWORLD_DATA`` folder (idempotent; standard library only).

    python envs/alfworld/prepare_data.py [--archives DIR] [--dest DIR] [--splits train valid_seen ...]

``--archives`` (default ``$AGENTJAX_DATA/alfworld``) holds ``json_2.1.1_<split>.tar.xz``; each archive unpacks to
``<split>/<task>/<trial>/game.tw-pddl``, which lands in ``<dest>/json_2.1.1/<split>/`` (``--dest`` default
``.data/alfworld``, git-ignored): the layout that ALFWorld's ``alfworld-download`` writes, so ``ALFWORLD_DATA=<dest>``
works for this project and for ALFWorld's own scripts. A split is unpacked into a temporary folder and renamed into
place when complete, so an interrupted run leaves nothing half-written; a split already in place is skipped. All
four archives (4,027 games, 360 MB unpacked) take about 2.5 s on one core (train 1.9 s), so every split is
unpacked by default.

``make test`` runs this before pytest when ``ALFWORLD_DATA`` is unset and the archives exist, and exports
``ALFWORLD_DATA=.data/alfworld``. Prints the destination folder.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tarfile
import tempfile
import time

VERSION = "json_2.1.1"
SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")


def safe_extract(tar: tarfile.TarFile, dest: str) -> None:
    """``tar.extractall(dest)`` of regular files and folders inside ``dest`` only: Python's ``filter="data"`` where
    it exists (3.11.4 and later; Debian 12's python3.11 is 3.11.2), else the same check by hand."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    root = os.path.realpath(dest)
    for member in tar.getmembers():
        path = os.path.realpath(os.path.join(dest, member.name))
        if not (member.isfile() or member.isdir()) or os.path.commonpath([root, path]) != root:
            raise ValueError(f"{tar.name}: refusing to unpack {member.name!r} (a link, a device or a path outside "
                             "the destination)")
    tar.extractall(dest)


def extract_split(archive: pathlib.Path, dest: pathlib.Path, split: str) -> bool:
    """Unpacks one split into ``dest/json_2.1.1/<split>``; False when it was already there."""
    target = dest / VERSION / split
    if target.is_dir():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{split}.") as tmp:
        with tarfile.open(archive, "r:xz") as tar:
            safe_extract(tar, tmp)
        unpacked = pathlib.Path(tmp) / split
        if not unpacked.is_dir():
            unpacked = pathlib.Path(tmp) / VERSION / split
        if not unpacked.is_dir():
            raise FileNotFoundError(f"{archive} does not unpack to {split}/ or {VERSION}/{split}/")
        os.replace(unpacked, target)
    return True


def prepare(archives: pathlib.Path, dest: pathlib.Path, splits: tuple[str, ...] = SPLITS) -> pathlib.Path:
    missing = [s for s in splits if not (archives / f"{VERSION}_{s}.tar.xz").is_file()]
    if missing:
        names = ", ".join(f"{VERSION}_{s}.tar.xz" for s in missing)
        raise FileNotFoundError(
            f"{archives} lacks {names}; set --archives (or AGENTJAX_DATA), or point ALFWORLD_DATA"
            " at an `alfworld-download` folder instead"
        )
    for split in splits:
        start = time.perf_counter()
        if extract_split(archives / f"{VERSION}_{split}.tar.xz", dest, split):
            print(f"alfworld: unpacked {split} in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    for leftover in (dest / VERSION).glob(".*"):  # temporary folders of an interrupted run
        shutil.rmtree(leftover, ignore_errors=True)
    return dest


def main() -> None:
    default = pathlib.Path(os.environ.get("AGENTJAX_DATA", "../shared/data")) / "alfworld"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archives", type=pathlib.Path, default=default)
    parser.add_argument("--dest", type=pathlib.Path, default=pathlib.Path(".data/alfworld"))
    parser.add_argument("--splits", nargs="+", choices=SPLITS, default=list(SPLITS))
    args = parser.parse_args()
    print(prepare(args.archives, args.dest, tuple(args.splits)).resolve())


if __name__ == "__main__":
    main()
