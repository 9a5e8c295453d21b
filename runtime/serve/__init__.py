"""`ssd-serve`: an OpenAI-compatible HTTP server over `ssd_runtime.Generator`.

Nothing heavy is imported here: `app` needs the `serve` extra (FastAPI,
uvicorn, jinja2) and `ray_app` the `ray` extra; `config` is plain Python.
"""
from __future__ import annotations
