"""Imported by the fork server alone, first of what it preloads (``executors.prestart``): the server process ends
without the interpreter's teardown.

A build's driver stops the fork server at its end and waits for it (``executors.stop_prestarted``: no process left
behind). The server holds numpy's and weightprep's modules, the chat stage's too for conversations, and freeing
them object by object took ~25 ms of a 20,000-conversation build's ~1.05 s, with the driver waiting. An exit
function ends it at once instead, after those of the modules it preloads next (run in the reverse order of their
registration). Nothing of the server's is left undone: it writes nothing; the one exit function registered before
this one, multiprocessing's own, stops processes started as ``multiprocessing.Process`` objects, which the server
has none of (it forks the build's workers itself, and multiprocessing ends each with ``os._exit``, running none of
the server's exit functions)."""

from __future__ import annotations

import atexit
import os

atexit.register(os._exit, 0)
