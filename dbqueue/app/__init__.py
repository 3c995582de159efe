"""The App facade (``dbqueue.App``) and the parts it delegates to: registration, the calls that
create jobs (sync and async), results and calls, cancellation, eager mode, the morgue, periodic
schedules, queue declarations and monitoring. Internal except for ``App``, which ``dbqueue``
exports."""

from dbqueue.app.facade import App

__all__ = ["App"]
