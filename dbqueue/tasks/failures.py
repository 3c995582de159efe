"""A failed attempt as the job's list of errors keeps it: the exception's line and a traceback
trimmed to the handler's own frames, and the bounds that keep that list small.

A traceback caught by the worker starts with the frames that called the handler — dbqueue's
executor, its middlewares and watchdog, SQLAlchemy's greenlet bridge, asyncio's and
``concurrent.futures``' plumbing — which say nothing about the failure and bury the handler's
one frame. Those are dropped (by the module each frame runs in); every exception of the chain
(``raise … from``, or raised while handling another) keeps its own handler frames.
"""

from __future__ import annotations

import json
import traceback as tracebacks
from dataclasses import dataclass
from types import TracebackType
from typing import Any

#: Entries a job keeps: the newest, one per failed attempt. With the default 20 attempts every
#: one is kept; a job failing 10,000 times keeps its last 25.
MAX_KEPT_ERRORS = 25
#: Characters of an entry's message and traceback (the traceback keeps its innermost part), so
#: that the list stays under about 150 KB however long the errors are.
MAX_ERROR_MESSAGE_CHARS = 2_000
MAX_TRACEBACK_CHARS = 4_000
#: Frames kept per exception (the innermost), and exceptions of a chain (the newest).
MAX_FRAMES = 30
MAX_CHAIN = 5
#: Modules whose frames are the machinery around a handler, not the handler.
MACHINERY = ("dbqueue", "sqlalchemy", "greenlet", "asyncio", "concurrent.futures")

_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


@dataclass(frozen=True)
class AttemptError:
    """What a failed attempt's entry says: the error's line(s) and where the handler raised it
    (None: no handler frame, e.g. an unknown task or a worker that died)."""

    message: str
    traceback: str | None = None

    def entry(self, attempt: int) -> str:
        """The entry as JSON text, without its time (the database stamps ``at``)."""
        return json.dumps(
            {
                "attempt": attempt,
                "message": _clip_head(self.message, MAX_ERROR_MESSAGE_CHARS),
                "traceback": None
                if self.traceback is None
                else _clip_tail(self.traceback, MAX_TRACEBACK_CHARS),
            },
            ensure_ascii=False,
        )


def attempt_error(exc: BaseException) -> AttemptError:
    """The entry of an attempt that failed by raising ``exc``."""
    return AttemptError(exception_line(exc), handler_traceback(exc))


def exception_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def is_machinery(module: str | None) -> bool:
    if not module:
        return False
    return any(module == name or module.startswith(name + ".") for name in MACHINERY)


def handler_traceback(exc: BaseException) -> str | None:
    """``exc``'s traceback (its chain included, oldest first, as Python prints it) with the
    machinery's frames removed; None when no exception of the chain has a handler frame."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    link = ""
    while current is not None and id(current) not in seen and len(chain) < MAX_CHAIN:
        seen.add(id(current))
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, _CONTEXT
        else:
            current = None
    parts: list[str] = []
    any_frame = False
    for error, link in reversed(chain):
        frames = _handler_frames(error.__traceback__)
        any_frame = any_frame or bool(frames)
        text = "".join(tracebacks.format_exception_only(type(error), error))
        if frames:
            summary = tracebacks.StackSummary.extract(iter(frames), capture_locals=False)
            text = "Traceback (most recent call last):\n" + "".join(summary.format()) + text
        parts.append(text + link)
    return "".join(parts).rstrip("\n") if any_frame else None


def _handler_frames(tb: TracebackType | None) -> list[tuple[Any, int]]:
    frames = [
        (frame, lineno)
        for frame, lineno in tracebacks.walk_tb(tb)
        if not is_machinery(frame.f_globals.get("__name__"))
    ]
    return frames[-MAX_FRAMES:]


def _clip_head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 12] + " …[clipped]"


def _clip_tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "[clipped]… " + text[-(limit - 12) :]
