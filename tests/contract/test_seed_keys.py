"""The seed's dict keys on real claimed jobs and subscriptions, on every backend.

The seed (nsj-queue-lib) handed its handlers the queue row as a dict: every column of its table
must answer on a dbqueue Job, with the seed's status words, and an unknown key must say so.
"""

from __future__ import annotations

import datetime as dt

from dbqueue import DeadSubscriber, QueueClient, Subscriber, WorkerBase, WorkerPubSubBase

# The seed's queue table, column by column, as its README lists them.
SEED_JOB_COLUMNS = (
    "id",
    "id_inicial",
    "data_hora_inicial",
    "data_hora",
    "origem",
    "destino",
    "processo",
    "chave_externa",
    "proxima_tentativa",
    "tentativa",
    "status",
    "reenfileirado",
    "estouro_tentativas",
    "mensagem",
    "id_anterior",
    "data_hora_anterior",
    "status_anterior",
    "mensagem_anterior",
    "payload",
    "tenant",
    "grupo_empresarial",
    "payload_hash",
    "pub_sub",
    "publication_id",
    "subscriber_id",
    "dead",
    "live_id",
    "prioridade",
)
# The seed's subscriber table.
SEED_SUBSCRIPTION_COLUMNS = (
    "id",
    "tenant",
    "grupo_empresarial",
    "processo",
    "url",
    "http_method",
    "headers",
    "ativo",
    "created_at",
)


def seed_view(row, columns):
    """What a seed handler reads: every column by its key, and what an unknown key gives."""
    seen = {key: row[key] for key in columns}
    try:
        row["no_such_column"]
    except Exception as exc:  # noqa: BLE001 - the type is what is checked
        seen["unknown"] = exc
    seen["default"] = row.get("no_such_column", "fallback")
    return seen


def test_every_seed_column_resolves_on_a_claimed_job(backend):
    app = backend.app(max_attempts=2)
    seen = []

    class Worker(WorkerBase):
        def execute(self, payload, tarefa, bd_conn):
            seen.append({**seed_view(tarefa, SEED_JOB_COLUMNS), "job": tarefa.as_dict()})
            if tarefa["tentativa"] == 1:
                raise RuntimeError("first attempt fails")
            return "second attempt done"

    worker = Worker(app)
    with app.engine.begin() as conn:
        job_id = QueueClient(conn, app=app).insert_task(
            "loja", "erp", "faturar", "pedido-42", {"pedido": 42}, 7, "g1", prioridade=10
        )
    backend.drain(worker.app)

    first, second = seen
    for attempt, view in enumerate((first, second), start=1):
        job = view["job"]
        assert view["id"] == view["id_inicial"] == job_id
        assert (view["origem"], view["destino"]) == ("loja", "erp")
        assert (view["processo"], view["chave_externa"]) == ("faturar", "pedido-42")
        assert view["payload"] == {"pedido": 42} and view["payload_hash"] == job["payload_hash"]
        assert (view["tenant"], view["grupo_empresarial"], view["prioridade"]) == (7, "g1", 10)
        assert view["tentativa"] == attempt
        assert view["status"] == "processando", job["status"]  # the seed's word
        assert job["status"] in ("available", "running")  # job.status stays dbqueue's
        assert view["data_hora"] == job["run_at"]
        assert isinstance(view["data_hora_inicial"], dt.datetime)
        assert view["proxima_tentativa"] is None  # no retry is scheduled while it runs
        assert view["reenfileirado"] is False and view["estouro_tentativas"] is False
        assert view["mensagem"] == job["message"]
        assert view["pub_sub"] is False and view["dead"] is False
        assert view["publication_id"] is view["subscriber_id"] is view["live_id"] is None
        assert isinstance(view["unknown"], KeyError) and "no_such_column" in str(view["unknown"])
        assert view["default"] == "fallback"
    assert first["id_anterior"] is first["status_anterior"] is None
    assert first["mensagem_anterior"] is first["data_hora_anterior"] is None
    assert second["id_anterior"] == job_id and second["status_anterior"] == "falha"
    assert second["mensagem_anterior"].startswith("RuntimeError: first attempt fails")
    assert second["data_hora_anterior"] >= first["data_hora_inicial"]
    assert second["data_hora_inicial"] == first["data_hora_inicial"]
    assert backend.jobs()[0]["message"] == "second attempt done"


def test_seed_keys_of_a_delivery_its_dead_delivery_and_its_subscription(database):
    app = database.app(max_attempts=1)
    app.add_subscription(None, "assinante", "processo_x", tenant=3, business_group="g")
    seen = {}

    class Worker(WorkerPubSubBase):
        @Subscriber("assinante")
        def execute_subscriber(self, payload, subscription, tarefa, bd_conn):
            seen["subscription"] = seed_view(subscription, SEED_SUBSCRIPTION_COLUMNS)
            seen["live"] = seed_view(tarefa, SEED_JOB_COLUMNS)
            raise RuntimeError("always fails")

        @DeadSubscriber("assinante")
        def execute_dead_subscriber(self, payload, subscription, tarefa, bd_conn):
            seen["dead"] = seed_view(tarefa, SEED_JOB_COLUMNS)
            return "handled"

    worker = Worker(app)
    with app.engine.begin() as conn:
        publication_id = QueueClient(conn, app=app).insert_task_pub_sub(
            "o", "d", "processo_x", "k", {"a": 1}, tenant=3, grupo_empresarial="g"
        )
    database.drain(worker.app)

    subscription, live, dead = seen["subscription"], seen["live"], seen["dead"]
    assert (subscription["id"], subscription["processo"]) == ("assinante", "processo_x")
    assert (subscription["tenant"], subscription["grupo_empresarial"]) == (3, "g")
    assert subscription["url"] is subscription["headers"] is None
    assert subscription["http_method"] == "POST" and subscription["ativo"] is True
    assert isinstance(subscription["created_at"], dt.datetime)
    assert isinstance(subscription["unknown"], KeyError)
    assert "no_such_column" in str(subscription["unknown"])
    for view in (live, dead):
        assert view["publication_id"] == publication_id and view["subscriber_id"] == "assinante"
        assert view["pub_sub"] is False  # a delivery, not the publication's own record
        assert view["status"] == "processando" and view["tentativa"] == 1
    assert live["dead"] is False and live["live_id"] is None
    assert dead["dead"] is True and dead["live_id"] == live["id"] != dead["id"]
    assert dead["id_inicial"] == dead["id"] and dead["estouro_tentativas"] is False
    assert database.deliveries(publication_id)["assinante"]["status"] == "dead"
