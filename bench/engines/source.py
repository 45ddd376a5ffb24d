"""An engine's released Python source, for the tests and benchmarks that run its real code.

Where it comes from, first match wins:
  1. a carried copy: $PINSTAGE_ENGINE_SRC/<name>-<version>/ or <repo>/.engines/<name>-<version>/
     (what a GPU machine without a package index gets: copy the folder along);
  2. the cache: $PINSTAGE_ENGINE_CACHE (default ~/.cache/pinstage/engines)/<name>-<version>/;
  3. the wheel from the package index (`pip download --no-deps`), unpacked into the cache.
Only the wheel's .py files under the given prefixes are unpacked. A carried copy or cache that lacks a
listed file (a prefix ending in .py, added since it was made) is passed over, and the cache unpacked
afresh. If none works, engine_root raises
Unavailable with the reason (the tests' conftest turns it into a skip: they never pass without the
engine's code).
"""

import fcntl
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("PINSTAGE_ENGINE_CACHE", pathlib.Path.home() / ".cache" / "pinstage" / "engines"))
_COMPLETE = ".complete"  # written last, so that an interrupted unpack is never taken for a whole one


class Unavailable(RuntimeError):
    """An engine's source is neither carried, cached nor downloadable here; the message says why."""


def _missing(folder, prefixes):
    """The listed files (prefixes ending in .py) that a complete copy in `folder` lacks; all of them
    where the copy is incomplete or absent."""
    files = [p for p in prefixes if p.endswith(".py")]
    if not (folder / _COMPLETE).exists():
        return files or [_COMPLETE]
    return [p for p in files if not (folder / p).exists()]


def _carried(folder_name, prefixes):
    """The first carried copy holding every listed file, and the files each other complete one lacks."""
    roots = [pathlib.Path(os.environ["PINSTAGE_ENGINE_SRC"])] if os.environ.get("PINSTAGE_ENGINE_SRC") else []
    roots.append(REPO / ".engines")
    stale = []
    for root in roots:
        missing = _missing(root / folder_name, prefixes)
        if not missing:
            return root / folder_name, stale
        if (root / folder_name / _COMPLETE).exists():
            stale.append("%s lacks %s" % (root / folder_name, ", ".join(missing)))
    return None, stale


def _unpack(wheel, dest, prefixes):
    tmp = pathlib.Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + ".partial-"))
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.endswith(".py") and member.startswith(tuple(prefixes)):
                zf.extract(member, tmp)
        dist_info = [m for m in zf.namelist() if m.endswith(".dist-info/METADATA")]
        for member in dist_info:  # importlib.metadata.version() reads it
            zf.extract(member, tmp)
    (tmp / _COMPLETE).write_text(wheel.name + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _download(name, version, dest, prefixes):
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as wheel_dir:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            wheel_dir,
            "%s==%s" % (name, version),
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return "pip download %s==%s did not finish: %s" % (name, version, exc)
        wheels = list(pathlib.Path(wheel_dir).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return "pip download %s==%s failed (no package index reachable?): %s" % (name, version, last)
        _unpack(wheels[0], dest, prefixes)
    return None


def engine_root(name, version, prefixes):
    """The folder holding `name`'s source at `version` (put it on sys.path); Unavailable with why.

    prefixes: wheel paths to unpack, e.g. ["sglang/srt/"]; a carried copy must hold at least these."""
    folder = "%s-%s" % (name, version)
    carried, stale = _carried(folder, prefixes)
    if carried is not None:
        return carried
    cached = CACHE / folder
    CACHE.mkdir(parents=True, exist_ok=True)
    # pytest-xdist's workers ask at once: one downloads, the others wait here and find the cache.
    with open(CACHE / (folder + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        why = None if not _missing(cached, prefixes) else _download(name, version, cached, prefixes)
        if why is not None:
            raise Unavailable(
                "%s %s's source is not here: no carried copy (.engines/%s or $PINSTAGE_ENGINE_SRC)%s, "
                "no cache (%s) that holds the files needed, and %s"
                % (name, version, folder, "".join(" (%s)" % s for s in stale), cached, why)
            )
    return cached
