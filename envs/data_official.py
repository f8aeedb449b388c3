"""The official sources of the benchmark data (:mod:`envs.data`'s default) and their conversion into its layout.

Where upstream publishes another container or format, the conversion is the upstream tool's own rule, and the result
is verified: by the documented sha256 where the conversion reproduces the bytes (liblzma presets chosen for that:
``xz -9`` for TextCraft and WebShop, ``-9e`` for TextWorld-Sync), else by ``content_sha256``.

- ALFWorld ``json_2.1.1_<split>.tar.xz``: the release zip ``json_2.1.2_tw-pddl.zip`` (``alfworld-download``'s
  ``TW_PDDL_FILES_URL``), one tar.xz per split with the games ``AlfredTWEnv`` keeps; verified by content (another
  tar encoder's bytes differ).
- WebShop ``items_ins_v2_1000.json``: the Google Drive file of WebShop's ``setup.sh -d small``.
- WebShop ``products_1k.jsonl.xz``: there is no official file. It is rebuilt from ``items_shuffle_1000.json`` (+ the
  attribute and human-goal files) as WebShop's ``load_products`` and its search index build it; the documented file
  was recovered from a Lucene index instead, so the rebuild counts only if its content hash equals that file's, and
  otherwise fails and says so (the rebuild rule is tested against the documented rows; the Drive file itself could
  not be fetched where this was written).
- TextCraft(-Synth) task files: members of the ``platoon-textcraft`` 0.3.0 wheel on PyPI (sha256 pinned);
  ``textcraft_synth_recipes.json``: that wheel's ``synth_recipe_generator`` run with seed 42 and 25 items per
  domain tier (code from the pinned wheel is executed).
- TextWorld-Sync task files and generation inputs: SERA's released files (``OliverLeeXZ/SERA`` at the commit
  ``textworld_sync/README.md`` names), xz-compressed; the license file is TextWorldExpress's.

Google Drive may answer with a quota or sign-in page instead of a file; that is reported as such.
"""

from __future__ import annotations

import calendar
import dataclasses
import functools
import hashlib
import io
import json
import lzma
import pathlib
import random
import re
import sys
import tarfile
import types
import zipfile
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal

from envs.data_files import (
    DataError,
    DataFile,
    atomic_write,
    check,
    download,
    listing_sha256,
    mismatch_error,
    remove_partials,
    sha256_file,
)


@dataclasses.dataclass(frozen=True)
class Artifact:
    """One upstream file; ``urls`` are tried in order (a mirror of the same bytes after the original)."""

    urls: tuple[str, ...]
    sha256: str | None = None  # pinned where upstream publishes it (PyPI) or where it is the documented file


_SERA = "https://raw.githubusercontent.com/OliverLeeXZ/SERA/677eaa214ef878aad524ce07c8baa74ba05330a6/Dataset/"
_TWX = "https://raw.githubusercontent.com/cognitiveailab/TextWorldExpress/"
_GDRIVE = ("https://drive.usercontent.google.com/download?id={}&export=download&confirm=t",
           "https://drive.google.com/uc?export=download&id={}")


def _gdrive(file_id: str, sha256: str | None = None) -> Artifact:
    return Artifact(tuple(url.format(file_id) for url in _GDRIVE), sha256)


TEXTCRAFT_WHEEL = "platoon_textcraft-0.3.0-py3-none-any.whl"
ARTIFACTS: dict[str, Artifact] = {
    # alfworld-download (alfworld 0.4.2): TW_PDDL_FILES_URL, game.tw-pddl files under json_2.1.1/<split>/
    "json_2.1.2_tw-pddl.zip": Artifact(
        ("https://github.com/alfworld/alfworld/releases/download/0.4.0/json_2.1.2_tw-pddl.zip",)),
    # princeton-nlp/WebShop setup.sh -d small (gdown ids)
    "items_shuffle_1000.json": _gdrive("1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib"),
    "items_ins_v2_1000.json": _gdrive("1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu"),
    "items_human_ins.json": _gdrive("14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O"),
    # PyPI platoon-textcraft 0.3.0 (the index's sha256)
    TEXTCRAFT_WHEEL: Artifact(
        ("https://files.pythonhosted.org/packages/f1/0a/e9adad900e9611a434bb11eb6ef5f29586ece8effbe99aca1f25b221effd/"
         f"{TEXTCRAFT_WHEEL}",), "9f0e8819fc2897ec186f84eea0acb98b468fc84a1badeb2676264a7e055edfa3"),
    # SERA's released TextWorld-Sync files (OliverLeeXZ/SERA, the commit textworld_sync/README.md names)
    **{f"sera/{split}/{name}": Artifact((f"{_SERA}{split}/{name}",)) for split, name in (
        ("training", "textworld_multidish_train_1500_v9.json"), ("training", "textworld_train.jsonl"),
        ("validation", "textworld_dev.jsonl"), ("validation", "textworld_multidish_validation_200_v9.json"),
        ("eval", "textworld_multidish_test_1400_v9.json"), ("eval", "textworld_test.jsonl"))},
    "sera/generation/textworld_v9.json": Artifact(
        (f"{_SERA}generation/textworld_v9.json",), "64587e0982493fcebcb64300482035727f929a61714aad6f9260ec11840e3b7b"),
    "sera/generation/cooking_world.json": Artifact(
        (f"{_SERA}generation/cooking_world.json", f"{_TWX}main/textworld_express/cooking_world.json"),
        "ecef2d85523c9801d00ddb35c77b8f56e0f9f4ef37c022e8431102c0b49522fd"),
    "textworldexpress/LICENSE": Artifact(
        (f"{_TWX}4478cf444030736679df1cd40510f9c1da7de0ec/LICENSE",
         f"{_SERA}generation/licenses/textworldexpress-Apache-2.0.txt"),
        "6a0e828d0d1ac33b715cbf4ce9ec9d38303497d12d199d85122e7e207624138c"),
}


@dataclasses.dataclass(frozen=True)
class Downloaded:
    path: pathlib.Path  # in the run's cache
    url: str


Builder = Callable[[DataFile, Sequence[Downloaded], pathlib.Path], None]  # writes the documented file at the path


def _read(src: Downloaded, member: str | None = None) -> bytes:
    if member is None:
        return src.path.read_bytes()
    try:
        with zipfile.ZipFile(src.path) as archive:
            return archive.read(member)
    except KeyError:
        raise DataError(f"{src.url} has no {member}") from None
    except zipfile.BadZipFile:
        raise DataError(f"{src.url} is not a zip archive") from None


def _json(src: Downloaded) -> object:
    try:
        return json.loads(_read(src))
    except ValueError as e:
        raise DataError(f"{src.url} is not JSON: {e}") from None


def _check_content(file: DataFile, data: bytes, where: str) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if actual != file.content_sha256:
        raise mismatch_error(f"{file.path}'s content", where, file.content_sha256 or "", actual)


def copy(file: DataFile, inputs: Sequence[Downloaded], out: pathlib.Path, *, member: str | None = None) -> None:
    """The file is the artifact (or one member of a zip / wheel)."""
    out.write_bytes(_read(inputs[0], member))


def json_file(file: DataFile, inputs: Sequence[Downloaded], out: pathlib.Path) -> None:
    """The artifact, or its ``json.dumps`` re-serialization when only the formatting differs."""
    data = _read(inputs[0])
    if hashlib.sha256(data).hexdigest() != file.sha256:
        data = json.dumps(_json(inputs[0])).encode()
    out.write_bytes(data)


def xz(file: DataFile, inputs: Sequence[Downloaded], out: pathlib.Path, *, member: str | None = None,
       preset: int = 9) -> None:
    """The artifact (or a zip member), checked against ``content_sha256``, compressed with liblzma ``preset``."""
    data = _read(inputs[0], member)
    _check_content(file, data, inputs[0].url + (f" ({member})" if member else ""))
    out.write_bytes(lzma.compress(data, preset=preset))


ALFWORLD_TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
                       "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")


def _tarinfo(name: str, mtime: int, size: int | None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime, info.uname, info.gname = mtime, "root", "root"
    if size is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o775
    else:
        info.size, info.mode = size, 0o664
    return info


def alfworld_split(file: DataFile, inputs: Sequence[Downloaded], out: pathlib.Path, *, split: str) -> None:
    """One split of ALFWorld's release zip as ``<split>/<task>/<trial>/game.tw-pddl`` in a tar.xz.

    The zip holds ``json_2.1.1/<split>/<task>/<trial>/game.tw-pddl``; kept are the games ALFWorld's
    ``AlfredTWEnv.collect_game_files`` keeps (no ``movable`` / ``Sliced`` task folder, one of the six task types,
    ``solvable`` true), in path order, checked against ``content_sha256`` (their ``sha256sum`` listing).
    """
    src = inputs[0]
    try:
        archive = zipfile.ZipFile(src.path)
    except zipfile.BadZipFile:
        raise DataError(f"{src.url} is not a zip archive") from None
    games = []
    for info in archive.infolist():
        parts = pathlib.PurePosixPath(info.filename).parts
        if info.is_dir() or len(parts) < 4 or parts[-1] != "game.tw-pddl" or parts[-4] != split:
            continue
        task = parts[-3]
        if "movable" in task or "Sliced" in task or task.split("-")[0] not in ALFWORLD_TASK_TYPES:
            continue
        games.append(("/".join(parts[-4:]), info))
    rows, dirs = [], set()
    with archive, tarfile.open(out, "w:xz", preset=6) as tar:  # xz -6, as the documented archives
        for name, info in sorted(games, key=lambda game: game[0]):
            data = archive.read(info)
            try:
                if not json.loads(data).get("solvable", False):
                    continue
            except (ValueError, AttributeError):
                raise DataError(f"{src.url}: {info.filename} is not a game file (JSON)") from None
            mtime = calendar.timegm((*info.date_time, 0, 0, 0))
            for folder in reversed(pathlib.PurePosixPath(name).parents[:-1]):
                if folder not in dirs:
                    dirs.add(folder)
                    tar.addfile(_tarinfo(str(folder), mtime, None))
            tar.addfile(_tarinfo(name, mtime, len(data)), io.BytesIO(data))
            rows.append((name, hashlib.sha256(data).hexdigest()))
    if not rows:
        raise DataError(f"{src.url} has no {split} games (json_2.1.1/{split}/<task>/<trial>/game.tw-pddl)")
    digest = listing_sha256(rows)
    if digest != file.content_sha256:
        raise DataError(f"content mismatch for {file.path} from {src.url}: its {len(rows)} {split} games hash to "
                        f"{digest} (sha256 of their sha256sum listing), expected {file.content_sha256}; not kept")


_WEBSHOP_DROPPED = ("product_information", "brand", "brand_url", "list_price", "availability_quantity",
                    "availability_status", "total_reviews", "total_answered_questions", "seller_id", "seller_name",
                    "fulfilled_by_amazon", "fast_track_message", "aplus_present", "small_description_old")


def webshop_rows(items: Sequence[dict], attributes: Mapping[str, dict], human: Mapping[str, list]) -> list[dict]:
    """WebShop's product rows as its search index stores them, plus ``search_text`` (the indexed text).

    princeton-nlp/WebShop ``load_products`` (``web_agent_site/engine/engine.py``; human goals on, no review file:
    ``Reviews = []``, ``Rating = "N.A."``) and the ``contents`` of ``search_engine/convert_product_file_format.py``.
    """
    rows, seen = [], set()
    for raw in items:
        asin = raw["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        p = {k: v for k, v in raw.items() if k not in _WEBSHOP_DROPPED}
        p["Title"], p["Description"] = p["name"], p["full_description"]
        p["Reviews"], p["Rating"] = [], "N.A."
        small = p["small_description"]
        p["BulletPoints"] = small if isinstance(small, list) else [small]
        pricing = p.get("pricing")
        if not pricing:
            pricing, price_tag = [100.0], "$100.0"
        else:
            pricing = [float(Decimal(re.sub(r"[^\d.]", "", price))) for price in pricing.split("$")[1:]]
            price_tag = f"${pricing[0]}" if len(pricing) == 1 else f"${pricing[0]} to ${pricing[1]}"
            pricing = pricing[:2]
        p["pricing"], p["Price"] = pricing, price_tag
        options, option_to_image = {}, {}
        for name, contents in (p["customization_options"] or {}).items():
            if contents is None:
                continue
            values = []
            for content in contents:
                value = content["value"].strip().replace("/", " | ").lower()
                values.append(value)
                option_to_image[value] = content.get("image", None)
            options[name.lower()] = values
        p["options"], p["option_to_image"] = options, option_to_image
        entry = attributes.get(asin, {})
        p["Attributes"] = entry["attributes"] if "attributes" in entry else ["DUMMY_ATTR"]
        if asin in human:
            p["instructions"] = human[asin]
        p["MainImage"] = p["images"][0]
        p["query"] = p["query"].lower().strip()
        option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in options.items())
        p["search_text"] = " ".join([p["Title"], p["Description"], p["BulletPoints"][0], option_text]).lower()
        rows.append(p)
    return rows


def webshop_products(file: DataFile, inputs: Sequence[Downloaded], out: pathlib.Path) -> None:
    """``products_1k.jsonl.xz`` rebuilt from ``items_shuffle_1000.json`` (+ the attribute and human-goal files)."""
    items, attributes, human = (_json(src) for src in inputs)
    try:
        rows = webshop_rows(items, attributes, human)
    except Exception as e:  # a file of another shape
        raise DataError(f"{inputs[0].url} is not WebShop's product file ({e!r})") from None
    data = "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows).encode()
    actual = hashlib.sha256(data).hexdigest()
    if actual != file.content_sha256:
        raise DataError(
            f"{file.path} cannot be reproduced from the official files: rebuilt from {inputs[0].url} its content "
            f"has sha256 {actual}, expected {file.content_sha256}. The documented file was recovered from the Lucene "
            "index of a public WebShop re-packaging, not from these files; get it with --mirror from a copy of the "
            "data folder; not kept")
    out.write_bytes(lzma.compress(data, preset=9))


def textcraft_synth_recipes(file: DataFile, inputs: Sequence[Downloaded], out: pathlib.Path, *, seed: int = 42,
                            items_per_domain_tier: int = 25) -> None:
    """The TextCraft-Synth recipe DB: the wheel's own ``synth_recipe_generator`` (stdlib only) run as documented.

    It runs code from the downloaded wheel, whose sha256 is pinned (PyPI's); the global ``random`` state is restored.
    """
    member = "platoon_textcraft/synth_recipe_generator.py"
    source = _read(inputs[0], member)
    module = types.ModuleType("_agentjax_synth_recipe_generator")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    state = random.getstate()
    try:
        exec(compile(source, f"{inputs[0].url}!{member}", "exec"), module.__dict__)
        db = module.SynthRecipeDatabase()
        db.generate_all_recipes(seed=seed, items_per_domain_tier=items_per_domain_tier)
        book = {
            "base_items": sorted(db.base_items),
            "generator": f"platoon-textcraft 0.3.0 synth_recipe_generator, seed={seed}, "
                         f"items_per_domain_tier={items_per_domain_tier}",
            "item_depths": dict(db.item_depths),
            "recipes": {item: [{"ingredients": dict(r.ingredients), "result_count": r.result_count} for r in rs]
                        for item, rs in db.recipes.items()},
        }
    except Exception as e:  # upstream code: whatever it raises is its failure
        raise DataError(f"{inputs[0].url}: {member} failed: {e!r}") from None
    finally:
        random.setstate(state)
        sys.modules.pop(module.__name__, None)
    out.write_text(json.dumps(book, indent=0, sort_keys=True))


def _alfworld(split: str) -> tuple[tuple[str, ...], Builder]:
    return ("json_2.1.2_tw-pddl.zip",), functools.partial(alfworld_split, split=split)


def _wheel(name: str, builder: Callable[..., None] = copy, **kwargs) -> tuple[tuple[str, ...], Builder]:
    return (TEXTCRAFT_WHEEL,), functools.partial(builder, member=f"platoon_textcraft/data/{name}", **kwargs)


def _sera(name: str) -> tuple[tuple[str, ...], Builder]:
    return (f"sera/{name}",), functools.partial(xz, preset=9 | lzma.PRESET_EXTREME)


RECIPES: dict[str, tuple[tuple[str, ...], Builder]] = {  # documented file -> (artifacts, builder)
    **{f"alfworld/json_2.1.1_{split}.tar.xz": _alfworld(split)
       for split in ("train", "valid_seen", "valid_unseen", "valid_train")},
    "webshop/products_1k.jsonl.xz": (("items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json"),
                                     webshop_products),
    "webshop/items_ins_v2_1000.json": (("items_ins_v2_1000.json",), json_file),
    "textcraft/textcraft_train.jsonl": _wheel("textcraft_train.jsonl"),
    "textcraft/textcraft_val.jsonl": _wheel("textcraft_val.jsonl"),
    "textcraft/textcraft_synth_train.jsonl.xz": _wheel("textcraft_synth_train.jsonl", xz, preset=9),
    "textcraft/textcraft_synth_val.jsonl.xz": _wheel("textcraft_synth_val.jsonl", xz, preset=9),
    "textcraft/textcraft_synth_recipes.json": ((TEXTCRAFT_WHEEL,), textcraft_synth_recipes),
    "textworld_sync/generation_inputs/LICENSE-textworldexpress-Apache-2.0.txt": (("textworldexpress/LICENSE",), copy),
    "textworld_sync/generation_inputs/cooking_world.json": (("sera/generation/cooking_world.json",), copy),
    "textworld_sync/generation_inputs/textworld_v9.json": (("sera/generation/textworld_v9.json",), copy),
    **{f"textworld_sync/{name}.xz": _sera(name) for name in (
        "training/textworld_multidish_train_1500_v9.json", "training/textworld_train.jsonl",
        "validation/textworld_dev.jsonl", "validation/textworld_multidish_validation_200_v9.json",
        "eval/textworld_multidish_test_1400_v9.json", "eval/textworld_test.jsonl")},
}


class Artifacts:
    """Downloads upstream artifacts into the run's cache once (a failure is remembered, not retried per file)."""

    def __init__(self, cache: pathlib.Path, artifacts: Mapping[str, Artifact], log: Callable[[str], None]):
        self.cache, self.artifacts, self.log = cache, artifacts, log
        self.got: dict[str, Downloaded | DataError] = {}

    def __call__(self, name: str) -> Downloaded:
        if name not in self.got:
            try:
                self.got[name] = self._get(name)
            except DataError as e:
                self.got[name] = e
        got = self.got[name]
        if isinstance(got, DataError):
            raise got
        return got

    def _get(self, name: str) -> Downloaded:
        artifact = self.artifacts[name]
        target = self.cache / name
        remove_partials(target)
        if target.is_file() and artifact.sha256 in (None, sha256_file(target)):  # left by an interrupted run
            return Downloaded(target, artifact.urls[0])
        errors = []
        for url in artifact.urls:
            self.log(f"fetching {url}")
            try:
                with atomic_write(target) as tmp:
                    download(url, tmp)
                    if artifact.sha256 and (actual := sha256_file(tmp)) != artifact.sha256:
                        raise mismatch_error(name, url, artifact.sha256, actual)
                self.log(f"fetched {url} ({target.stat().st_size / 1e6:.1f} MB)")
                return Downloaded(target, url)
            except DataError as e:
                errors.append(str(e))
        raise DataError("; ".join(errors))


def fetch_official(file: DataFile, target: pathlib.Path, get: Callable[[str], Downloaded],
                   recipes: Mapping[str, tuple[tuple[str, ...], Builder]] = RECIPES) -> str:
    """Builds ``file`` from its official artifacts onto ``target`` when its hash is right; returns what was checked."""
    if file.path not in recipes:
        raise DataError(f"no official source is known for {file.path}; use --mirror")
    names, build = recipes[file.path]
    inputs = [get(name) for name in names]
    urls = ", ".join(src.url for src in inputs)
    with atomic_write(target) as tmp:
        build(file, inputs, tmp)
        how = check(file, tmp)
        if how is None:
            raise mismatch_error(file.path, urls, file.sha256, sha256_file(tmp))
    return f"{how} verified, built from {urls}"


