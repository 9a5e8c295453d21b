"""One error family for the whole toolkit.

Every message names the thing, what was expected, what was found and what to
do; the CLIs print it without a traceback and exit non-zero.
"""
from __future__ import annotations


class SsdError(Exception):
    """Base of every error the toolkit raises on purpose."""


class ConfigError(SsdError):
    """Bad user input: options, model folders, prompts, generation settings."""


class BundleError(SsdError):
    """A bundle that is missing, corrupt, or from an unsupported schema."""


class ParityError(SsdError):
    """An exported graph does not reproduce the Hugging Face model."""


class BackendError(SsdError):
    """An execution backend cannot be loaded or refuses a request."""
