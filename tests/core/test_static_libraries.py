"""The browser's libraries come from npm (package-lock.json, `npm ci` in make's install step) and are
served as static files from node_modules/: nothing in the repository, nothing from a CDN."""

from pathlib import Path

from django.contrib.staticfiles import finders

ROOT = Path(__file__).resolve().parents[2]


def test_uplot_is_served_from_what_npm_installed() -> None:
    found = finders.find("uplot/uPlot.iife.min.js")
    assert found is not None
    assert Path(found).is_relative_to(ROOT / "node_modules" / "uplot" / "dist")
    assert finders.find("uplot/uPlot.min.css") is not None


def test_make_installs_the_locked_packages_and_git_keeps_none_of_them() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "npm ci" in makefile and "package-lock.json" in makefile
    assert "node_modules/" in (ROOT / ".gitignore").read_text().split()
    assert not list((ROOT / "static").rglob("uPlot*"))  # not copied into the repository
