"""Write a bundle atomically: build in a temporary sibling folder, then rename.

An interrupted or failed export leaves no half bundle behind; `--force`
replaces an existing bundle only once the new one is complete.
"""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ssd_runtime.errors import ConfigError
from ssd_runtime.manifest import MANIFEST_NAME, Manifest, manifest_json, sha256_file


def check_output(output: Path, force: bool) -> None:
    if output.exists() and not force:
        raise ConfigError(f"output {output} already exists. ---> HINT: pass --force to replace "
                          f"it, or choose another --output.")
    if output.exists() and not output.is_dir():
        raise ConfigError(f"output {output} exists and is not a folder; remove it or choose "
                          f"another --output.")
    parent = output.absolute().parent           # the nearest folder that exists above it
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"output {output} cannot be created: {parent} is a file, not a "
                          f"folder. ---> HINT: choose another --output.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"output {output} cannot be created: {parent} is not writable. "
                          f"---> HINT: choose another --output.")


@contextmanager
def staging(output: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces `output`, on failure it vanishes."""
    check_output(output, force)
    tmp = output.parent / f".{output.name}.tmp-{os.getpid()}"
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as exc:
        raise ConfigError(f"output {output} cannot be created: {exc.strerror or exc} "
                          f"({exc.filename or output.parent}). ---> HINT: choose another "
                          f"--output.") from None
    try:
        yield tmp
        old = output.parent / f".{output.name}.old-{os.getpid()}"
        if output.exists():
            output.rename(old)
        tmp.rename(output)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def finish_manifest(root: Path, manifest: Manifest) -> Manifest:
    """Add the sha256 of every file under `root` and write manifest.json."""
    files = {p.relative_to(root).as_posix(): sha256_file(p)
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST_NAME}
    done = Manifest(**{**manifest.__dict__, "files": files})
    (root / MANIFEST_NAME).write_text(manifest_json(done))
    return done
