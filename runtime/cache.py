"""What start-up measures once and remembers on disk (docs/design.md §8.1): bundle files whose
sha256 was checked, the CPU threads chosen by timing, and the calibrations of k="auto".

Everything here only saves time: a cache that is missing, unreadable, corrupt or unwritable
is ignored, and the thing is checked or measured again. Nothing here raises.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from .machine import cpu_cores, cpu_model

VERSION = 3                   # of the files below; another version's files are ignored
# (2: sessions stop spinning when a run returns, docs/design.md §9: older timings are stale;
# 3: a thread placement is kept with how busy the machine was when it was timed, and the
# all-cores default is left only for a clear gain: older placements may be a busy moment's)
ENV = "SSD_CACHE_DIR"         # where the cache lives (default $XDG_CACHE_HOME/ssd, ~/.cache/ssd)
# A file is remembered as checked only once its last change is this far in the past, by the
# file system's clock: a write in the same clock tick as the check (ticks of a few ms, 2 s on
# FAT) could leave size and times as they were ("racy git"). A later write gets later times.
RACY_S = 2.0

T = TypeVar("T")
Stat = tuple[int, int, int, int, int]      # size, mtime_ns, ctime_ns, inode, device


def cache_dir() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    try:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    except RuntimeError:           # no home folder: a path where nothing can be read or written
        base = os.devnull
    return Path(base) / "ssd"


# -- checked files --------------------------------------------------------------------------

def file_stat(path: Path) -> Stat:
    """What changes whenever the file's bytes do: its ctime is set by the kernel on every
    write, rename and utime, and cannot be set back by a user (only by the clock)."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


def checked(path: Path, stat: Stat, sha256: str) -> bool:
    """Whether this very version of the file (`stat`, taken before) was found to have
    `sha256` by an earlier check: a remembered check counts only for the same size, times,
    inode and device, and only from a private cache (a folder others could write to could
    hold forged entries)."""
    entry = _entry("checked", str(path.absolute()))
    record = _read(entry, private=True)
    return record is not None and record.get("path") == str(path.absolute()) and \
        record.get("stat") == list(stat) and record.get("sha256") == sha256


def remember_checked(path: Path, stat: Stat, sha256: str) -> None:
    """The file had `sha256` when hashed: remember it, unless it changed meanwhile or too
    recently to tell a later change apart (RACY_S)."""
    try:
        now_stat = file_stat(path)
    except OSError:
        return
    last_change = max(now_stat[1], now_stat[2])
    if now_stat != stat or time.time_ns() - last_change < RACY_S * 1e9:
        return
    _write(_entry("checked", str(path.absolute())),
           {"path": str(path.absolute()), "stat": list(stat), "sha256": sha256})


# -- measurements ---------------------------------------------------------------------------

def measurement_key(bundle: str, what: str, **more: Any) -> dict[str, Any]:
    """What a timing depends on: the bundle (its manifest's digest, Manifest.digest, which
    holds every file's sha256), this machine (CPU model, cores it may use), ONNX Runtime's
    version, and `more`."""
    import onnxruntime as ort

    return _plain({"what": what, "bundle": bundle, "cpu": cpu_model(), "cores": cpu_cores(),
                   "machine": platform.machine(), "onnxruntime": ort.__version__, **more})


def recall(key: dict[str, Any], restore: Callable[[Any], T]) -> T | None:
    """What was remembered under `key`, through `restore` (which raises ValueError,
    TypeError or KeyError on a malformed record); None if there is none that restores."""
    data = _read(_entry("measured", json.dumps(key, sort_keys=True)))
    if data is None or data.get("key") != key:
        return None
    try:
        return restore(data["value"])
    except (ValueError, TypeError, KeyError):
        return None


def remember(key: dict[str, Any], record: Any) -> None:
    _write(_entry("measured", json.dumps(key, sort_keys=True)), {"key": key, "value": record})


def remembered(key: dict[str, Any] | None, measure: Callable[[], T],
               record: Callable[[T], Any], restore: Callable[[Any], T],
               redo: bool = False) -> T:
    """What `measure()` returned before under `key`, else measure() now and remember
    record(value). `key` None: nothing is remembered; `redo`: measured again, and
    remembered in place of the old."""
    if key is not None and not redo:
        value = recall(key, restore)
        if value is not None:
            return value
    value = measure()
    if key is not None:
        remember(key, record(value))
    return value


# -- files ----------------------------------------------------------------------------------

def _entry(kind: str, name: str) -> Path:
    return cache_dir() / kind / f"{hashlib.sha256(name.encode()).hexdigest()[:32]}.json"


def _read(path: Path, private: bool = False) -> dict[str, Any] | None:
    try:
        if private and not (_private(path.parent) and _private(path)):
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):                 # JSONDecodeError, UnicodeDecodeError
        return None
    return data if isinstance(data, dict) and data.get("version") == VERSION else None


def _write(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all: a temporary file renamed into place (several processes may write
    the same entry at once: the last rename wins, each file complete)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp.write_text(json.dumps({"version": VERSION, **data}))
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def _private(path: Path) -> bool:
    """Owned by this user and writable by no one else (where the platform has owners)."""
    if not hasattr(os, "geteuid"):
        return True
    st = os.stat(path)
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _plain(data: Any) -> Any:
    """As JSON reads it back (tuples become lists), so that a read key compares equal."""
    return json.loads(json.dumps(data))
