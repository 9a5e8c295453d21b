"""API keys for `ssd-serve`: where they are read from, and which one a request carries.

    keys = load_keys(["KEY"], "keys.txt")        # --api-key (repeatable), --api-key-file
    keys.tenant(bearer_token(headers.get("authorization")))   # "key-2", or None: answer 401
Only SHA-256 digests are kept, so a config that is printed, pickled into Ray replicas or
logged holds no key. Plain Python: the CLI and the Ray deployment read it without FastAPI.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import ConfigError

ENV = "SSD_API_KEY"     # the key when no --api-key / --api-key-file is given (as VLLM_API_KEY)
NEW_KEY = "python -c 'import secrets; print(\"sk-\" + secrets.token_urlsafe(32))'"
FILE_FORMAT = "one key per line; blank lines and lines starting with # are skipped"


@dataclass(frozen=True, repr=False)
class ApiKeys:
    """The keys a server accepts, as SHA-256 digests in the order given (duplicates once)."""

    digests: tuple[bytes, ...]

    @classmethod
    def of(cls, keys: Sequence[str]) -> ApiKeys:
        digests = [_digest(key) for key in keys]
        return cls(tuple(dict.fromkeys(digests)))

    def __len__(self) -> int:
        return len(self.digests)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self)} keys)"

    def tenant(self, token: str | None) -> str | None:
        """The id of the key `token` is ("key-N", N its place in the order given: stable for
        a configuration, and it says nothing of the key), None when it is none of them.
        Constant time: the token's digest is compared with every key's, with no early exit,
        so the time taken tells neither whether nor which key matched."""
        if token is None:
            return None
        digest = _digest(token)
        found = 0
        for index, known in enumerate(self.digests, 1):    # the digests are distinct:
            found += index * hmac.compare_digest(digest, known)   # at most one adds
        return tenant_id(found) if found else None


def tenant_id(index: int) -> str:
    """The caller's identity the engine sees (Request.tenant) for the key at `index` (from 1)."""
    return f"key-{index}"


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value (the scheme in any case,
    RFC 7235); None for no header, another scheme, or no token."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def load_keys(given: Sequence[str] | None, file: str | Path | None,
              environ: Mapping[str, str] = os.environ) -> ApiKeys | None:
    """The keys of `--api-key` (each) and `--api-key-file`; with neither, $SSD_API_KEY when it
    is set and not empty; None when there is no key (the server is open). A key that is
    empty, or that a Bearer header cannot carry, and a key file that is missing, unreadable,
    not text or holds no key are ConfigErrors that name the flag or file, never the key."""
    keys = [_checked(key, f"--api-key #{n}") for n, key in enumerate(given or [], 1)]
    if file is not None:
        keys += _read_file(Path(file))
    elif not keys and environ.get(ENV):
        keys = [_checked(environ[ENV], f"${ENV}")]
    return ApiKeys.of(keys) if keys else None


def _read_file(path: Path) -> list[str]:
    hint = f"---> HINT: give a text file of keys, {FILE_FORMAT}."
    try:
        text = path.read_bytes().decode("utf-8-sig")        # a BOM is not part of a key
    except FileNotFoundError:
        raise ConfigError(f"--api-key-file {path}: no such file. {hint}") from None
    except OSError as exc:
        raise ConfigError(f"--api-key-file {path} cannot be read ({exc.strerror}). "
                          f"{hint}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--api-key-file {path} is not UTF-8 text (byte {exc.start}). "
                          f"{hint}") from None
    lines = [line.strip() for line in text.splitlines()]
    keys = [_checked(line, f"--api-key-file {path}, line {n},")
            for n, line in enumerate(lines, 1) if line and not line.startswith("#")]
    if not keys:
        raise ConfigError(f"--api-key-file {path} holds no key (it is empty, or only blank "
                          f"lines and # comments). ---> HINT: put the keys in it, {FILE_FORMAT}; "
                          f"a new key: {NEW_KEY}.")
    return keys


def _checked(key: str, where: str) -> str:
    """The key, or a ConfigError naming `where` (not the key, which must not be printed)."""
    if not key:
        raise ConfigError(f"{where} is empty: a server with an empty key would take any "
                          f"`Authorization: Bearer` header. ---> HINT: give a key ({NEW_KEY}), "
                          f"or leave the option out to serve without keys.")
    if not all("!" <= c <= "~" for c in key):
        raise ConfigError(f"{where} holds a space or a character outside printable ASCII, which "
                          f"an `Authorization: Bearer` header cannot carry as given. ---> HINT: "
                          f"use a key of printable ASCII with no spaces, e.g. {NEW_KEY}.")
    return key


def _digest(token: str) -> bytes:
    # headers arrive decoded as latin-1 (ASGI): every character is one byte
    return hashlib.sha256(token.encode("latin-1", "replace")).digest()
