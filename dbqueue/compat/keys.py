"""The seed's column names on dbqueue's Job and Subscription (``job["mensagem"]`` …).

The seed (nsj-queue-lib) handed handlers the queue row as a dict keyed by its table's columns.
dbqueue keeps one row per job where the seed kept one row per attempt, so a few of those columns
are derived from several attributes; ``install()`` puts the mapping on the core classes, which
know only the mechanism (``ItemAccess``), never these names.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from ..job import Job, Status
from ..pubsub import PUBLICATION_MARKER, Subscription

#: dbqueue's status → the seed's word. ``available`` depends on the job (see ``seed_status``);
#: a dead job's last attempt failed (``estouro_tentativas`` says attempts ran out); the seed
#: could not cancel, so ``cancelada`` is dbqueue's own word.
STATUS_WORDS: Mapping[str, str] = {
    Status.RUNNING: "processando",
    Status.SUCCEEDED: "sucesso",
    Status.DEAD: "falha",
    Status.CANCELLED: "cancelada",
    Status.FAILED: "falha",  # previous_status of a failed attempt
}

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


def _claimed(job: Job) -> bool:
    """Handed to a handler: running, or claimed in a transaction that leaves the row
    ``available`` until the outcome is written (the claim time is then set)."""
    return job.status == Status.RUNNING or (
        job.status == Status.AVAILABLE and job.started_at is not None
    )


def _in_future(when: dt.datetime | None) -> bool:
    if when is None:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when > dt.datetime.now(dt.timezone.utc)


def seed_status(job: Job) -> str:
    """``agendada`` (waiting for its time), ``pendente`` (due), ``processando``, ``sucesso``,
    ``falha`` (dead) or ``cancelada``."""
    if _claimed(job):
        return "processando"
    if job.status == Status.AVAILABLE:
        return "agendada" if _in_future(job.run_at) else "pendente"
    return STATUS_WORDS.get(job.status, job.status)


def _waiting_for_retry(job: Job) -> bool:
    return job.status == Status.AVAILABLE and not _claimed(job) and job.previous_status is not None


#: Every column of the seed's queue table → a Job attribute, or a function of the Job.
JOB_KEYS: Mapping[str, str | Callable[[Job], Any]] = {
    "id": "id",
    "id_inicial": "id",  # one row per job: its first attempt is the job itself
    "data_hora_inicial": lambda job: job.first_attempt_at or job.started_at,
    "data_hora": "run_at",
    "origem": "origin",
    "destino": "destination",
    "processo": "task",
    "chave_externa": "external_key",
    "proxima_tentativa": lambda job: job.run_at if _waiting_for_retry(job) else None,
    "tentativa": "attempt",
    "status": seed_status,
    "reenfileirado": lambda job: False,  # the row is always the latest attempt
    "estouro_tentativas": lambda job: job.status == Status.DEAD,
    "mensagem": "message",
    "id_anterior": lambda job: job.id if job.previous_status is not None else None,
    "data_hora_anterior": "previous_attempt_at",
    "status_anterior": lambda job: STATUS_WORDS.get(job.previous_status, job.previous_status),
    "mensagem_anterior": "previous_message",
    "payload": "payload",
    "tenant": "tenant",
    "grupo_empresarial": "business_group",
    "payload_hash": "payload_hash",
    "pub_sub": lambda job: job.subscription_id == PUBLICATION_MARKER,
    "publication_id": "publication_id",
    "subscriber_id": "subscription_id",
    "dead": "dead",
    "live_id": "live_id",
    "prioridade": "priority",
}

#: Every column of the seed's subscriber table → a Subscription attribute.
SUBSCRIPTION_KEYS: Mapping[str, str] = {
    "id": "id",
    "tenant": "tenant",
    "grupo_empresarial": "business_group",
    "processo": "topic",
    "url": "url",
    "http_method": "http_method",
    "headers": "headers",
    "ativo": "active",
    "created_at": "created_at",
}


def install() -> None:
    """Make Job and Subscription answer the seed's keys (done when dbqueue.compat is imported,
    which ``import dbqueue`` always does)."""
    Job.ITEM_ALIASES = JOB_KEYS
    Subscription.ITEM_ALIASES = SUBSCRIPTION_KEYS
