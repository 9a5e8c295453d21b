"""The tests' exports read torch's list of torchlib functions once per process.

torch.onnx.export (dynamo) builds its op registry anew on every call, and onnxscript's
get_torchlib_ops re-parses the Python source of each of ~500 torchlib functions only to read its
domain: 0.41 of 1.52 s of the export of a 1-layer tiny model (tools/export_profile.py;
docs/performance-notes.md, "The exporter's cost on a tiny model"). A real model's export takes
minutes, so the product leaves torch as it ships (no reach into torch's private modules); the
suite, which exports a few hundred tiny graphs, reuses the list. It holds the same function
objects in the same order on every call (torchlib registers them on import), so the registry
and the graph are the same: tests/graphs/test_trace.py compares the written protos byte for byte.
tests/conftest.py turns it on for the session; a torch without the handle exports as before.
"""
from __future__ import annotations

import functools
import importlib
from contextlib import contextmanager


def handle():
    """torch's lazy handle of onnxscript's API, or None where this torch has none."""
    try:
        lazy = importlib.import_module("torch.onnx._internal._lazy_import")
    except ImportError:
        return None
    found = getattr(lazy, "onnxscript_apis", None)
    return found if found is not None and hasattr(found, "get_torchlib_ops") else None


def enable() -> bool:
    """From now on the handle's get_torchlib_ops returns a fresh list of the process's copy;
    True if it does (already, or now)."""
    api = handle()
    if api is None:
        return False
    if "get_torchlib_ops" not in vars(api):
        real = api.get_torchlib_ops
        vars(api)["get_torchlib_ops"] = lambda: list(_ops(real))
    return True


def disable() -> None:
    """torch as it ships."""
    api = handle()
    if api is not None:
        vars(api).pop("get_torchlib_ops", None)


@contextmanager
def read_once():
    """enable() meanwhile, and the state before it after."""
    api = handle()
    was = api is not None and "get_torchlib_ops" in vars(api)
    enable()
    try:
        yield
    finally:
        if not was:
            disable()


@contextmanager
def as_shipped():
    """disable() meanwhile, and the state before it after."""
    api = handle()
    was = api is not None and "get_torchlib_ops" in vars(api)
    disable()
    try:
        yield
    finally:
        if was:
            enable()


@functools.cache
def _ops(get_torchlib_ops) -> tuple:
    return tuple(get_torchlib_ops())
