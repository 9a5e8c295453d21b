"""Per-file durations of a pytest run, as a markdown table for CONTRIBUTING, from its JUnit XML.

    python tools/test_durations.py [.pytest-junit.xml] [--tests N] [--root .]

`make test` and `make test-fast` write .pytest-junit.xml (ignored by git), so the table can be
made after any run. A file's time is the sum of its tests' times; pytest counts a test's
setup and teardown with it, so a session or module fixture (the exported bundles, the tiny
models) is paid by the first test that asks for it on each xdist worker (or that waits on the
lock while the other worker builds it): a file's figure holds the exports it was first to
need. The files' sum is the workers' time added up; the run's wall time is printed beside it.
"""
from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

NOTE = ("A file's time is the sum of its tests' times, setup and teardown included: a session "
        "or module fixture (an export, the tiny models) lands in the first test that uses it on "
        "each xdist worker, so a file's figure holds the exports it was first to need. The sum "
        "adds both workers' time; the wall time is the run's own.")


@dataclass
class FileTimes:
    seconds: float = 0.0
    tests: int = 0
    skipped: int = 0
    slowest: list[tuple[float, str]] = field(default_factory=list)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("xml", type=Path, nargs="?", default=Path(".pytest-junit.xml"),
                   help="a pytest --junitxml file (default .pytest-junit.xml)")
    p.add_argument("--tests", type=int, default=0, metavar="N",
                   help="also list the N slowest tests")
    p.add_argument("--root", type=Path, default=Path("."),
                   help="the repository root, to map test classnames to files")
    args = p.parse_args(argv)
    if not args.xml.exists():
        print(f"test_durations: {args.xml} not found. ---> HINT: run `make test-fast` (or pytest "
              f"--junitxml={args.xml}) first.", file=sys.stderr)
        return 2
    files, wall, slowest = read(args.xml, args.root)
    print(table(files, wall))
    if args.tests:
        print(f"\nThe {args.tests} slowest tests:\n")
        print("| seconds | test |\n|---:|---|")
        for seconds, name in sorted(slowest, reverse=True)[:args.tests]:
            print(f"| {seconds:.1f} | `{name}` |")
    return 0


def read(xml: Path, root: Path) -> tuple[dict[str, FileTimes], float | None,
                                         list[tuple[float, str]]]:
    """(file -> its times, the run's wall seconds or None, every (seconds, test id))."""
    tree = ET.parse(xml)
    suites = [tree.getroot()] if tree.getroot().tag == "testsuite" \
        else tree.getroot().findall("testsuite")
    files: dict[str, FileTimes] = defaultdict(FileTimes)
    every: list[tuple[float, str]] = []
    wall = 0.0
    for suite in suites:
        wall += float(suite.get("time", 0.0))
        for case in suite.iter("testcase"):
            path = case.get("file") or file_of(case.get("classname", ""), root)
            seconds = float(case.get("time", 0.0))
            entry = files[path]
            entry.seconds += seconds
            entry.tests += 1
            entry.skipped += case.find("skipped") is not None
            every.append((seconds, f"{path}::{case.get('name')}"))
    return dict(files), wall or None, every


def file_of(classname: str, root: Path) -> str:
    """tests.runtime.test_batch.TestX -> tests/runtime/test_batch.py (the longest prefix that
    is a file under root); the classname itself if none is."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        candidate = Path(*parts[:n]).with_suffix(".py")
        if (root / candidate).is_file():
            return candidate.as_posix()
    return classname


def table(files: dict[str, FileTimes], wall: float | None) -> str:
    total = sum(f.seconds for f in files.values())
    count = sum(f.tests for f in files.values())
    lines = ["| file | tests | seconds | share |", "|---|---:|---:|---:|"]
    for path, f in sorted(files.items(), key=lambda kv: -kv[1].seconds):
        tests = f"{f.tests}" + (f" ({f.skipped} skipped)" if f.skipped else "")
        share = f.seconds / total if total else 0.0
        lines.append(f"| `{path}` | {tests} | {f.seconds:.1f} | {share:.1%} |")
    lines.append(f"| **total** | {count} | {total:.1f} | 100% |")
    if wall is not None:
        lines.append(f"\nWall time of the run: {wall:.1f} s ({wall / 60:.1f} min); the sum of "
                     f"the files' times: {total:.1f} s.")
    lines.append(f"\n{NOTE}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
