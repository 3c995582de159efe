"""The App facade (``dbqueue.App``) and the parts it delegates to: registration, queue
declarations, periodic schedules, the calls that create jobs (sync and async) and what follows
their commit (wake-ups, eager mode), results and calls, cancellation, subscriptions, job
lookups, the morgue, monitoring and maintenance. Internal except for ``App``, which ``dbqueue``
exports."""

from dbqueue.app.facade import App

__all__ = ["App"]
