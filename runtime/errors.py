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


def cli_main(prog: str, interrupted: str = ""):
    """Decorator for a CLI's main(argv): an SsdError becomes one line on stderr and exit
    code 2 (never a traceback); Ctrl-C exits 130, saying `interrupted` if given."""
    import functools
    import sys

    def wrap(main):
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except SsdError as exc:
                print(f"{prog}: error: {exc}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                if interrupted:
                    print(f"{prog}: {interrupted}", file=sys.stderr)
                return 130
        return run
    return wrap
