"""The install reproduces: requirements.txt pins every package, and the library's ranges stop at it."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)(?: ; .+)?$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        match = PIN.match(line)
        assert match, f"requirements.txt: {line!r} is not name==version (with an optional marker)"
        name, version = _canonical(match[1]), Version(match[2])
        assert pins.setdefault(name, version) == version, f"requirements.txt pins {name} twice, differently"
    return pins


def _requirements_in() -> list[Requirement]:
    lines = (ROOT / "requirements.in").read_text().splitlines()
    return [Requirement(line.split("#")[0]) for line in lines if line.split("#")[0].strip()]


def test_every_line_of_the_lock_is_a_pin_and_transformers_is_new_enough():
    lock = _lock()
    assert lock["transformers"] >= Version("5.25")
    assert lock["torch"] <= Version("2.14.1")  # the newest this kind of machine has on its own disk


def test_the_lock_holds_every_direct_dependency_within_its_range():
    lock = _lock()
    for req in _requirements_in():
        name = _canonical(req.name)
        assert name in lock, f"requirements.in names {name}, the lock does not: run scripts/lock.sh"
        assert req.specifier.contains(lock[name]), f"the lock's {name} {lock[name]} is outside {req.specifier}"
    for text in ("index-url", "http://", "https://", "--"):
        assert text not in (ROOT / "requirements.txt").read_text(), "the lock names an index or an option"


def test_the_librarys_ranges_are_capped_at_the_lock():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = _lock()
    extras = project["optional-dependencies"]
    for text in [*project["dependencies"], *extras["video"], *extras["app"], *extras["eval"]]:
        req = Requirement(text)
        name = _canonical(req.name)
        caps = [s for s in req.specifier if s.operator in ("<=", "<")]
        assert caps, f"pyproject.toml: {text} has no upper bound"
        assert req.specifier.contains(lock[name]), f"pyproject.toml: {text} excludes the lock's {lock[name]}"
        assert all(Version(s.version) == lock[name] for s in caps if s.operator == "<="), (
            f"pyproject.toml caps {name} elsewhere than the lock's {lock[name]} (the newest the suite passed with)"
        )
