"""The seed library's names (nsj-queue-lib), for code ported from it.

This package sits on top of the app: it may import any of dbqueue, and nothing in dbqueue's core
imports it. ``dbqueue`` re-exports its classes, so ``dbqueue.QueueClient`` and
``dbqueue.compat.QueueClient`` are the same. Importing it makes Job and Subscription answer the
seed's column names (``job["mensagem"]``, ``subscription["processo"]``).
"""

from . import keys
from .client import QueueClient
from .workers import DeadSubscriber, Subscriber, WorkerBase, WorkerPubSubBase

keys.install()

__all__ = ["DeadSubscriber", "QueueClient", "Subscriber", "WorkerBase", "WorkerPubSubBase"]
