"""A headless Chromium for tests that open pages: found on the PATH, or installed from Debian's
`chromium-headless-shell` package (as root, `apt-get update` first) under a file lock, so that a
fresh CI machine gets one; None with the reason where neither works."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

BROWSERS = ("chromium-headless-shell", "chrome-headless-shell", "chromium", "google-chrome", "google-chrome-stable")
DEBIAN_PACKAGE = "chromium-headless-shell"
INSTALL_LOCK = Path(tempfile.gettempdir()) / "maskstream-browser-install.lock"
# Flags that work offline in a container: no sandbox (root), no GPU, nothing that calls home.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1")


def find_browser() -> str | None:
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    return None


def install_browser() -> str:
    """Installs Debian's chromium-headless-shell; returns '' or why it could not."""
    if not shutil.which("apt-get"):
        return "no browser on the PATH and no apt-get to install chromium-headless-shell"
    if os.geteuid() != 0:
        return "no browser on the PATH and not root, so chromium-headless-shell cannot be installed"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock_wait = ["-o", "DPkg::Lock::Timeout=600"]  # another engineer's or test's apt may hold dpkg's lock
    for command in (["apt-get", *lock_wait, "update"],
                    ["apt-get", *lock_wait, "install", "-y", "--no-install-recommends", DEBIAN_PACKAGE]):
        try:
            result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        except subprocess.TimeoutExpired:
            return f"`{' '.join(command)}` did not finish in 10 minutes"
        if result.returncode != 0:
            return f"`{' '.join(command)}` failed ({result.returncode}): {result.stderr.strip()[-500:]}"
    return ""


def browser_or_reason() -> tuple[str | None, str]:
    """(the browser's path, '') or (None, why there is none)."""
    if path := find_browser():
        return path, ""
    with open(INSTALL_LOCK, "w") as lock:  # one installer at a time; the others find its browser
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path := find_browser():
            return path, ""
        reason = install_browser()
        if reason:
            return None, reason
        path = find_browser()
        return path, "" if path else f"{DEBIAN_PACKAGE} installed, but none of {', '.join(BROWSERS)} is on the PATH"


def run_browser(browser: str, profile: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The browser once, headless, with a fresh profile folder; raises if it fails."""
    command = [browser, *FLAGS, f"--user-data-dir={profile}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result
