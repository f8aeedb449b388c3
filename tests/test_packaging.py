"""The Makefile's prebuilt wheels (`make wheels`) are the versions pyproject.toml pins: a drifted pin would make pip
build the sdist again in every venv (minutes of CI), with nothing failing."""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_prebuilt_sdists_are_pyproject_pins():
    match = re.search(r"^SDISTS := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, "Makefile: no SDISTS line"
    sdists = set(match.group(1).split())
    pins = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert sdists and sdists <= pins, sdists - pins
