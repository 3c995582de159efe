"""Internal: the registry of handlers (tasks, subscribers, dead handlers, middlewares and
worker hooks), retry rules and periodic schedules: plain Python, no SQL."""
