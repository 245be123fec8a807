"""Debian packages the development commands install when a command they run is missing: the test
command's (promtool, chromium, ...) and `make run`'s Prometheus. One way to install them: apt-get as
root, non-interactive, without recommends."""

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import TextIO


def can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def apt_install(packages: Sequence[str], *, output: TextIO | None = None) -> bool:
    """Install `packages` with apt-get (its output to `output`, else inherited); whether it worked."""
    if not can_install():
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["update", "-qq"], ["install", "-y", "-qq", "--no-install-recommends", *packages]):
        done = subprocess.run(
            ["apt-get", *command], env=env, stdout=output, stderr=subprocess.STDOUT if output else None,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            return False
    return True


# What the tests need from Debian: promtool checks the shipped alert rules and prometheus runs them
# against a live stack, amtool checks the Alertmanager routes, Chromium runs the UI tests.
SYSTEM_PACKAGES = {
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "amtool": "prometheus-alertmanager",
    "docker-compose": "docker-compose",
    "chromium": "chromium",
}


def ensure_system_packages() -> None:
    """Install the Debian packages the tests need when their commands are missing (as root, apt-get)."""
    missing = [package for command, package in SYSTEM_PACKAGES.items() if not shutil.which(command)]
    if not missing:
        return
    if not can_install():
        sys.exit(f"missing Debian packages: {' '.join(missing)} (apt-get install {' '.join(missing)})")
    print(f"Installing {' '.join(missing)} (Debian packages)...", flush=True)
    if not apt_install(missing):
        sys.exit(f"apt-get could not install {' '.join(missing)}")
