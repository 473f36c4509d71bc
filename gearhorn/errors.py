"""The one base of gearhorn's own errors.

A :class:`GearhornError` says what went wrong in one line a person can act
on; the ``gearhorn`` command prints it (no traceback) and exits with its
``exit_code``. Anything else that escapes is a bug and keeps its traceback.
"""


class GearhornError(Exception):
    """An error with a one-line message for the person running gearhorn."""

    exit_code = 1


class BadRequest(GearhornError, ValueError):
    """Input gearhorn refuses (a job payload, a name); ``str(exc)`` is the
    one-line reason."""
