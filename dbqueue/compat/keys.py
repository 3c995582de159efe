"""The seed's status words, for the seed's client calls (``list_equivalent_task``).

The seed's column names themselves (``job["mensagem"]``, ``subscription["processo"]``) are part of
Job and Subscription (``dbqueue.job.SEED_JOB_KEYS``, ``Subscription.ITEM_ALIASES``).
"""

from __future__ import annotations

from collections.abc import Mapping

from dbqueue.job import STATUS_WORDS, Status, seed_status

__all__ = ["SEED_STATUSES", "STATUS_WORDS", "seed_status"]

#: The seed's status words → the dbqueue statuses holding such jobs (list_equivalent_task).
#: ``morta`` is accepted too: dbqueue's earlier name for a dead job.
SEED_STATUSES: Mapping[str, tuple[str, ...]] = {
    "agendada": (Status.AVAILABLE,),
    "pendente": (Status.AVAILABLE,),
    "processando": (Status.RUNNING,),
    "falha": (Status.AVAILABLE, Status.DEAD),
    "sucesso": (Status.SUCCEEDED,),
    "cancelada": (Status.CANCELLED,),
    "morta": (Status.DEAD,),
}
