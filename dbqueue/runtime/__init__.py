"""Internal: what a queue needs at run time, below the App and the worker: the runtime context
(settings, engines, strategy), the jobs a call writes and where it writes them, cancellation,
leader-only maintenance, periodic ticks, tenant databases and waking workers after a commit."""
