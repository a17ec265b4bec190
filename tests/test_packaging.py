"""The package as it ships: one version, read everywhere from the installed metadata;
the sdist and the wheel carry the license and the changelog."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import tenxstore

ROOT = Path(__file__).resolve().parents[1]


def declared_version() -> str:
    """``version`` of pyproject's [project] table (tomllib is 3.11+; this is 3.10 too)."""
    text = (ROOT / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    found = re.search(r'^version = "([^"]+)"$', project, re.M)
    assert found, "pyproject.toml's [project] table has no version"
    return found.group(1)


def test_the_version_is_the_installed_distributions() -> None:
    installed = metadata.version("tenxstore")
    assert tenxstore.__version__ == installed
    command = Path(sys.executable).with_name("tenxstore")  # the installed entry point
    done = subprocess.run(
        [str(command), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == f"tenxstore {installed}"
    # An editable install's metadata is written at install time: a version bumped in
    # pyproject.toml since needs a reinstall before anything reports it.
    assert installed == declared_version(), "reinstall: pip install -e ."


def test_the_changelog_has_a_section_for_this_version() -> None:
    changelog, version = (ROOT / "CHANGELOG.md").read_text(), re.escape(declared_version())
    assert "## [Unreleased]" in changelog
    assert re.search(rf"^## \[{version}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
    assert re.search(rf"^\[{version}\]: https://github.com/tenxstore/tenxstore/", changelog, re.M)


@pytest.mark.slow
def test_the_sdist_and_the_wheel_carry_the_license_and_the_changelog(tmp_path: Path) -> None:
    """``python -m build`` makes the sdist, then the wheel from the sdist (so the wheel
    also proves the sdist is complete enough to build from)."""
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    version = declared_version()
    [sdist] = tmp_path.glob(f"tenxstore-{version}.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for shipped in ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "alembic.ini"):
        assert shipped in names
    assert not any(name.startswith(".venv") for name in names)

    [wheel] = tmp_path.glob(f"tenxstore-{version}-py3-none-any.whl")
    info = f"tenxstore-{version}.dist-info"
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        assert (
            archive.read(f"{info}/extra_metadata/CHANGELOG.md")
            == (ROOT / "CHANGELOG.md").read_bytes()
        )
        meta = archive.read(f"{info}/METADATA").decode()
    assert "License-Expression: MIT" in meta
    assert "Project-URL: Changelog, " in meta
    assert "Classifier: Programming Language :: Python :: 3.10" in meta
