"""The two ways kgen fails: the user's input is wrong (exit 2) or a check failed (exit 1)."""

from __future__ import annotations


class KgenError(Exception):
    """An error the CLI prints as one clean message, never a traceback."""

    exit_code = 2


class SpecError(KgenError):
    """A spec is wrong: names the file, the line and the field, and what was expected."""

    def __init__(self, path: str, line: int | None, field: str, message: str):
        self.path, self.line, self.field, self.message = path, line, field, message
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


class VerifyFailure(KgenError):
    """Generated output drifted from its spec, or failed a static or numerical check."""

    exit_code = 1
