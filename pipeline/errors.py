"""Errors that tell the user exactly where the problem is."""

from __future__ import annotations


class PipelineError(Exception):
    """Base class for errors the CLI reports without a traceback."""


class RunStopped(PipelineError):
    """The run stopped cleanly before its end (budget reached, endpoint down): finished work is
    kept and the same command continues it. The CLI prints the one line and exits EXIT_CODE."""

    EXIT_CODE = 1


class InputError(PipelineError):
    """Bad corpus input: names the file, the record and the field."""

    def __init__(self, file: str, record: str | None, field: str | None, message: str) -> None:
        self.file = str(file)
        self.record = record
        self.field = field
        self.message = message
        where = [f"file {self.file}"]
        if record is not None:
            where.append(f"record {record}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{', '.join(where)}: {message}")

    def __reduce__(self) -> tuple:
        # Ray pickles errors raised in tasks; the default rebuilds from `args` (the one joined
        # message), which this __init__ does not take, and Ray then reports it as unserializable.
        return (type(self), (self.file, self.record, self.field, self.message))


class ConfigError(PipelineError):
    """Bad configuration: names the key."""
