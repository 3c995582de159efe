"""Task definitions: the handler for each task name, with its queue and retry policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError, UnknownTaskError
from .identifiers import check_queue_name, check_task_name
from .job import Job
from .retry import Backoff

Handler = Callable[..., Any]


@dataclass
class TaskDefinition:
    name: str
    handler: Handler | None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    backoff: Backoff | None = None
    dead_handler: Handler | None = None
    options: dict[str, Any] = field(default_factory=dict)


class TaskRegistry:
    """Task name → definition; an optional catch-all serves every other name (WorkerBase)."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskDefinition] = {}
        self.catch_all: TaskDefinition | None = None

    def register(self, definition: TaskDefinition) -> TaskDefinition:
        check_task_name(definition.name)
        if definition.queue is not None:
            check_queue_name(definition.queue)
        existing = self._tasks.get(definition.name)
        if (
            existing is not None
            and existing.handler is not None
            and definition.handler is not None
            and existing.handler is not definition.handler
        ):
            raise ConfigurationError(
                f"task {definition.name!r} is registered twice ({_describe(existing.handler)} "
                f"and {_describe(definition.handler)}): give one of them another name"
            )
        if existing is not None:
            # A dead handler registered before its task (or the reverse): merge the two.
            definition.dead_handler = definition.dead_handler or existing.dead_handler
            definition.handler = definition.handler or existing.handler
        self._tasks[definition.name] = definition
        return definition

    def add_dead_handler(self, name: str, handler: Handler) -> None:
        definition = self._tasks.get(name)
        if definition is None:
            definition = self.register(TaskDefinition(name=name, handler=None))
        definition.dead_handler = handler

    def get(self, name: str) -> TaskDefinition | None:
        return self._tasks.get(name)

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def queues(self) -> list[str]:
        return sorted({d.queue for d in self._tasks.values() if d.queue is not None})

    def definition_for(self, job: Job) -> TaskDefinition:
        definition = self._tasks.get(job.task)
        if definition is not None and definition.handler is not None:
            return definition
        if self.catch_all is not None:
            return self.catch_all
        known = ", ".join(repr(n) for n in self.names()) or "none"
        raise UnknownTaskError(
            f"unknown task {job.task!r}: no handler is registered for it in this worker "
            f"(registered: {known}). Register it with @app.task({job.task!r}) in the module "
            "passed to --app, or run a worker that has it on this queue."
        )

    def handler_for(self, job: Job) -> Handler:
        definition = self.definition_for(job)
        if job.dead:
            if definition.dead_handler is None:
                raise UnknownTaskError(
                    f"job {job.id} is a dead-letter job of task {job.task!r}, but no dead handler "
                    f"is registered for it: add @app.dead_handler({job.task!r})"
                )
            return definition.dead_handler
        assert definition.handler is not None
        return definition.handler

    def has_dead_handler(self, job: Job) -> bool:
        definition = self._tasks.get(job.task) or self.catch_all
        return definition is not None and definition.dead_handler is not None


def _describe(handler: Handler) -> str:
    module = getattr(handler, "__module__", "?")
    return f"{module}.{getattr(handler, '__qualname__', repr(handler))}"
