"""Imported by a fork server in tests/test_executors.py (its preload), never by the tests themselves: the
interpreter's teardown of the server, where it runs, frees ``_torn``, which then leaves a line in the file named by
``WEIGHTPREP_TEST_TEARDOWN`` (written by file descriptor: the teardown may close file objects first)."""

from __future__ import annotations

import os


class _Torn:
    def __init__(self, write, fd: int) -> None:
        self.write, self.fd = write, fd

    def __del__(self) -> None:
        self.write(self.fd, b"teardown\n")


_torn = _Torn(os.write, os.open(os.environ["WEIGHTPREP_TEST_TEARDOWN"], os.O_WRONLY | os.O_CREAT | os.O_APPEND))
