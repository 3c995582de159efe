"""The dashboard's pages and actions, a Starlette application (``create_app``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from dbqueue.app import running
from dbqueue.app.facade import App
from dbqueue.dashboard import charts, queries
from dbqueue.dashboard.actions import ACTIONS, ActionError
from dbqueue.dashboard.security import (
    AUTH_COOKIE,
    CSRF_COOKIE,
    CSRF_FIELD,
    Access,
    csrf_ok,
    new_csrf,
)
from dbqueue.tasks.failures import MAX_KEPT_ERRORS

HERE = Path(__file__).parent


class Dashboard:
    """One dashboard on one App: its pages read through the App, its actions call it."""

    def __init__(self, app: App, access: Access) -> None:
        self.app = app
        self.access = access
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.templates.env.filters["tojson_pretty"] = _pretty_json

    # ---- plumbing ---------------------------------------------------------------------------
    def render(self, request: Request, name: str, **context: Any) -> Response:
        token = request.cookies.get(CSRF_COOKIE) or new_csrf()
        base = request.scope.get("root_path", "")
        context.update(
            base=base,
            csrf=token,
            actions=self.access.actions,
            read_only=self.access.read_only,
            done=request.query_params.get("done", ""),
            here=_here(request),
        )
        response = self.templates.TemplateResponse(request, name, context)
        if request.cookies.get(CSRF_COOKIE) != token:
            response.set_cookie(
                CSRF_COOKIE, token, httponly=True, samesite="strict", path=base or "/"
            )
        return response

    def guarded(self, page: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """A page that asks for the token first, when the dashboard has one."""

        def endpoint(request: Request) -> Response:
            if not self.access.authorised(dict(request.headers), request.cookies):
                if request.url.path.rstrip("/").endswith(("/api/v1/stats", "/metrics")):
                    return PlainTextResponse("a token is required", status_code=401)
                base = request.scope.get("root_path", "")
                login = f"{base}/login?{urlencode({'next': _here(request)})}"
                return RedirectResponse(login, status_code=303)
            return page(request)

        return endpoint

    # ---- pages ------------------------------------------------------------------------------
    def overview(self, request: Request) -> Response:
        report = self.app.stats_report()
        with self.app.engine.connect() as conn:
            start, finished = queries.throughput(self.app, conn)
        rows = []
        for queue, entry in report["by_queue"].items():
            series = finished.get(
                queue, {"succeeded": [0] * queries.BUCKETS, "dead": [0] * queries.BUCKETS}
            )
            rows.append((queue, entry, charts.bars(series, start, queries.BUCKET_MINUTES)))
        total = charts.total(finished, queries.BUCKETS)
        chart = charts.bars(total, start, queries.BUCKET_MINUTES, width=720, height=120)
        return self.render(request, "overview.html", rows=rows, total=report["total"], chart=chart)

    def jobs(self, request: Request) -> Response:
        where = queries.JobFilter.from_params(request.query_params)
        before = _int(request.query_params.get("before"))
        with self.app.engine.connect() as conn:
            runs = queries.running_now(self.app, conn, where)
            rows, next_before = queries.list_jobs(self.app, conn, where, before, runs)
            count = queries.count_jobs(self.app, conn, where, running.in_flight(runs))
        return self.render(
            request,
            "jobs.html",
            rows=rows,
            where=where,
            count=count,
            cap=queries.COUNT_CAP,
            statuses=queries.STATUSES,
            has_key=queries.has_key_column(self.app),
            next_page=_page_link(where, next_before),
            first_page=before is not None,
            filter_query=urlencode(where.params()),
        )

    def job(self, request: Request) -> Response:
        job_id = int(request.path_params["job_id"])
        with self.app.engine.connect() as conn:
            row = self.app.get_job(job_id, conn)
            runs = running.of_rows(self.app.context, conn, [row] if row is not None else [])
        if row is None:
            return self.render(request, "missing.html", what=f"job {job_id}")
        now = runs.get(job_id)
        return self.render(
            request,
            "job.html",
            job=now.on(row) if now is not None else row,
            running=now,
            pending=row["status"] in ("available", "running"),
            kept_errors=MAX_KEPT_ERRORS,
        )

    def dead(self, request: Request) -> Response:
        params = request.query_params
        queue, task = params.get("queue") or None, params.get("task") or None
        order = (
            params.get("order") if params.get("order") in ("finished_at", "id") else "finished_at"
        )
        rows = self.app.dead_jobs(queue, queries.PAGE_SIZE * 2, task=task, order_by=order)
        where = queries.JobFilter(queue=queue or "", task=task or "", status="dead")
        with self.app.engine.connect() as conn:
            count = queries.count_jobs(self.app, conn, where)
        return self.render(
            request,
            "dead.html",
            rows=rows,
            queue=queue or "",
            task=task or "",
            order=order,
            count=count,
            cap=queries.COUNT_CAP,
            more_query=urlencode(where.params()),
        )

    def periodic(self, request: Request) -> Response:
        return self.render(request, "periodic.html", rows=self.app.periodic_status())

    def workers(self, request: Request) -> Response:
        infos = [info.as_dict() for info in self.app.workers(include_gone=True)]
        return self.render(request, "workers.html", rows=infos)

    def subscriptions(self, request: Request) -> Response:
        return self.render(request, "subscriptions.html", rows=self.app.subscriptions())

    def stats_api(self, request: Request) -> Response:
        return JSONResponse(self.app.stats_report())

    def login_page(self, request: Request) -> Response:
        return self.render(request, "login.html", next=_safe_next(request.query_params.get("next")))

    # ---- POSTs ------------------------------------------------------------------------------
    async def form(self, request: Request) -> dict[str, str] | Response:
        """The POSTed form, or the refusal when its CSRF value does not match."""
        body = (await request.body()).decode("utf-8", "replace")
        form = {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}
        origin, host = request.headers.get("origin"), request.headers.get("host")
        if not csrf_ok(
            form.get(CSRF_FIELD, ""), request.cookies.get(CSRF_COOKIE, ""), origin, host
        ):
            return PlainTextResponse(
                "refused: the form's CSRF value does not match its cookie (reload the page)",
                status_code=403,
            )
        return form

    async def login(self, request: Request) -> Response:
        form = await self.form(request)
        if isinstance(form, Response):
            return form
        base = request.scope.get("root_path", "")
        target = _safe_next(form.get("next"))
        if not self.access.token_matches(form.get("token", "")):
            return RedirectResponse(
                f"{base}/login?{urlencode({'next': target, 'done': 'wrong token'})}", 303
            )
        response = RedirectResponse(f"{base}{target}", status_code=303)
        response.set_cookie(
            AUTH_COOKIE,
            self.access.cookie_value(),
            httponly=True,
            samesite="strict",
            path=base or "/",
        )
        return response

    async def act(self, request: Request) -> Response:
        if not self.access.actions:
            return PlainTextResponse("refused: this dashboard takes no actions", status_code=403)
        if not self.access.authorised(dict(request.headers), request.cookies):
            return PlainTextResponse("refused: a token is required for actions", status_code=403)
        form = await self.form(request)
        if isinstance(form, Response):
            return form
        action = ACTIONS.get(request.path_params["action"])
        if action is None:
            return PlainTextResponse("no such action", status_code=404)
        try:
            done = await run_in_threadpool(action, self.app, form)
        except ActionError as exc:
            done = f"refused: {exc}"
        base = request.scope.get("root_path", "")
        target = _safe_next(form.get("next"))
        glue = "&" if "?" in target else "?"
        return RedirectResponse(f"{base}{target}{glue}{urlencode({'done': done})}", status_code=303)


def create_app(
    app: App,
    *,
    token: str | None = None,
    read_only: bool = False,
    actions_without_token: bool = False,
    metrics: bool = True,
) -> Starlette:
    """The dashboard of ``app`` as an ASGI application (mount it anywhere, or serve it).

    ``token``: every page and action asks for it (Bearer header, or the login form's cookie).
    Without a token, actions exist only with ``actions_without_token=True`` (``dbqueue
    dashboard`` sets it when bound to loopback; set it when your own app authenticates the
    mount). ``read_only``: no action at all. ``metrics``: serve ``/metrics`` (Prometheus) when
    prometheus-client is installed.
    """
    board = Dashboard(app, Access(token, read_only, actions_without_token))
    g = board.guarded
    routes: list[Any] = [
        Route("/", g(board.overview)),
        Route("/jobs", g(board.jobs)),
        Route("/jobs/{job_id:int}", g(board.job)),
        Route("/dead", g(board.dead)),
        Route("/periodic", g(board.periodic)),
        Route("/workers", g(board.workers)),
        Route("/subscriptions", g(board.subscriptions)),
        Route("/api/v1/stats", g(board.stats_api)),
        Route("/login", board.login_page, methods=["GET"]),
        Route("/login", board.login, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    if not board.access.read_only:
        routes.append(Route("/actions/{action}", board.act, methods=["POST"]))
    if metrics:
        routes.extend(_metrics_routes(app, board))
    return Starlette(routes=routes)


def _metrics_routes(app: App, board: Dashboard) -> list[Any]:
    try:
        from dbqueue.observability import metrics

        served = metrics.make_asgi_app(app)
    except Exception:  # prometheus-client is optional: no /metrics without it
        return []

    class GuardedMetrics:
        """prometheus-client's ASGI app behind the dashboard's token."""

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            request = Request(scope)
            if not board.access.authorised(dict(request.headers), request.cookies):
                refusal = PlainTextResponse("a token is required", status_code=401)
                await refusal(scope, receive, send)
                return
            await served(scope, receive, send)

    return [Route("/metrics", GuardedMetrics())]


def wsgi_app(app: App, **options: Any) -> Any:
    """The dashboard as a WSGI application (Flask, Django): ``create_app`` through a2wsgi."""
    from a2wsgi import ASGIMiddleware

    return ASGIMiddleware(create_app(app, **options))


def _here(request: Request) -> str:
    """The request's path inside the dashboard, with its query: where a form returns to."""
    base = request.scope.get("root_path", "")
    path = request.url.path
    if base and path.startswith(base):
        path = path[len(base) :] or "/"
    query = {k: v for k, v in request.query_params.items() if k != "done"}
    return path + (f"?{urlencode(query)}" if query else "")


def _safe_next(value: str | None) -> str:
    """Only a path inside the dashboard: never another site (an open redirect)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _page_link(where: queries.JobFilter, before: int | None) -> str | None:
    if before is None:
        return None
    return urlencode({**where.params(), "before": str(before)})


def _pretty_json(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


__all__ = ["create_app", "wsgi_app"]
