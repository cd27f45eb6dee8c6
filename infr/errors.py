"""User-facing errors: one line, no traceback unless INFR_DEBUG is set."""


class InfrError(Exception):
    """An error the user can act on; the CLI prints its message alone."""


class GGUFError(InfrError):
    """The file is not a readable GGUF, or lacks what the model needs."""


class UnsupportedError(InfrError):
    """The file is valid but uses something infr does not implement."""
