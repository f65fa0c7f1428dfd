"""Errors a user can cause: shown as one line, exit status 2, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or environment; the message says what to do."""

    exit_status = 2
