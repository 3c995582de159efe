"""The seed library's names (nsj-queue-lib), for code ported from it.

This package sits on top of the app: it may import any of dbqueue, and nothing in dbqueue's core
imports it. ``dbqueue`` re-exports its classes, so ``dbqueue.QueueClient`` and
``dbqueue.compat.QueueClient`` are the same.
"""

from dbqueue.compat.client import QueueClient
from dbqueue.compat.workers import DeadSubscriber, Subscriber, WorkerBase, WorkerPubSubBase

__all__ = ["DeadSubscriber", "QueueClient", "Subscriber", "WorkerBase", "WorkerPubSubBase"]
