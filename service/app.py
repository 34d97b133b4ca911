"""The FastAPI application: stores opened in the lifespan, routers, error handlers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp

from trainctl.service.backends import build_backend
from trainctl.service.deps import AUTH
from trainctl.service.errors import error_responses, install_error_handlers
from trainctl.service.limits import Slots, StreamSlots
from trainctl.service.metrics import ServiceMetrics
from trainctl.service.middleware import (
    HostAllowList,
    JsonErrors,
    RequestMiddleware,
    SecurityHeaders,
)
from trainctl.service.routes import (
    checkpoints,
    dashboard,
    evals,
    exports,
    metrics,
    models,
    runs,
    system,
    tokens,
    webhooks,
)
from trainctl.service.routing import (
    match_whole_paths,
    operation_id,
    with_text_rule,
    without_null_parameters,
)
from trainctl.service.settings import Settings, get_settings
from trainctl.service.sinks.mirror import SinkMirrors
from trainctl.service.sse import EventFeed
from trainctl.service.webhooks.dispatcher import DispatchConfig, Dispatcher
from trainctl.store.checkpoints.factory import open_stores
from trainctl.store.db.outages import StallWatch
from trainctl.store.db.runs import RunStore
from trainctl.store.db.tokens import TokenStore
from trainctl.store.db.webhooks import WebhookStore
from trainctl.store.exceptions import StorageUnavailable

log = logging.getLogger("trainctl.service")

DESCRIPTION = """\
Submit **train**, **validate** and **benchmark** runs, follow them (server-sent events,
metrics, logs) and manage the checkpoints they write. When the server has a
`TRAINCTL_API_TOKEN`, every endpoint but `/healthz` needs `Authorization: Bearer <token>`.
"""


class TrainctlApi(FastAPI):
    """FastAPI, with a schema that states what the server accepts (`service.routing`), and
    errors in JSON even where the framework answers below every middleware of ours."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            self.openapi_schema = with_text_rule(without_null_parameters(super().openapi()))
        return self.openapi_schema

    def build_middleware_stack(self) -> ASGIApp:
        # Around Starlette's outermost layers, the body-size limit (413) and the error handler
        # (500), which answer outside the middleware a user can add: every answer, theirs
        # too, is JSON, carries the security headers and the request id, and is measured.
        errors_in_json = JsonErrors(super().build_middleware_stack(), self.max_body_size)
        return RequestMiddleware(SecurityHeaders(errors_in_json), metrics=self.state.metrics)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app. Without `settings`, they come from the environment (`get_settings`)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)  # the SQLite file goes in it
        store = RunStore(settings.db_url)
        store.create_all()
        stores = open_stores(settings.layout, store, interactive=True)
        ckpts, exports = stores.checkpoints, stores.exports
        # Before any worker starts: a staging folder now is a save (or an export, or a
        # prepare's upload to the bucket) that died with its worker.
        for folders in (ckpts, exports, stores.datasets):
            try:
                for experiment, name in folders.cleanup():
                    where = folders.storage.describe(experiment, name)
                    log.warning("cleaned up %s (left by an interrupted save or delete)", where)
            except StorageUnavailable as exc:
                # A bucket that is down or refuses us now: the service still starts, its
                # checkpoint routes answer 503 naming the bucket, and the next start sweeps.
                log.error("checkpoint storage unavailable at start, nothing swept: %s", exc)
        app.state.runs, app.state.checkpoints, app.state.exports = store, ckpts, exports
        app.state.database_watch = watch = StallWatch.of_database(settings.db_url)
        watch.start()
        app.state.datasets = stores.datasets
        app.state.store_slots = Slots(
            settings.store_concurrency, settings.store_wait_seconds, "store requests"
        )
        app.state.stream_slots = StreamSlots(
            settings.max_event_streams, settings.max_event_streams_per_token
        )
        bootstrap = settings.api_token.get_secret_value() if settings.api_token else None
        app.state.tokens = TokenStore(store.engine, bootstrap)
        app.state.event_feed = EventFeed(store, app.state.tokens)
        app.state.supervisor = supervisor = None
        # Threads of their own: a tracker that is down or slow never holds up a request.
        app.state.sink_mirrors = mirrors = SinkMirrors.build(settings, store, ckpts)
        app.state.webhooks = WebhookStore(store.engine)
        app.state.webhook_dispatcher = dispatcher = None
        try:
            mirrors.start()
            # Its own thread: a slow receiver never holds up a request (service/webhooks).
            dispatcher = Dispatcher(
                app.state.webhooks, store, DispatchConfig.from_settings(settings)
            )
            app.state.webhook_dispatcher = dispatcher
            dispatcher.start()
            # The launch backend (service.backends): local workers, or Slurm jobs.
            supervisor = build_backend(settings, store, app.state.metrics)
            app.state.supervisor = supervisor
            if supervisor is not None:
                supervisor.start()
            yield
        finally:
            if supervisor is not None:
                supervisor.stop()  # local workers checkpoint and hand their runs back first
            mirrors.stop()  # after the workers: a cursor resumes from here at the next start
            if dispatcher is not None:
                dispatcher.stop()  # a send it cuts short is due again at the next start
            watch.stop()
            store.close()

    app = TrainctlApi(
        title="trainctl",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # ours, served from the package: routes/dashboard.py
        redoc_url=None,
        max_body_size=settings.max_body_bytes,
        generate_unique_id_function=operation_id,
    )
    app.state.settings = settings
    install_error_handlers(app)
    unauthorized = error_responses(401)
    app.include_router(runs.router, dependencies=[AUTH], responses=unauthorized)
    app.include_router(checkpoints.router, dependencies=[AUTH], responses=unauthorized)
    app.include_router(exports.router, dependencies=[AUTH], responses=unauthorized)
    app.include_router(models.router, dependencies=[AUTH], responses=unauthorized)
    app.include_router(evals.router, dependencies=[AUTH], responses=unauthorized)
    app.include_router(system.router, dependencies=[AUTH], responses=unauthorized)
    app.include_router(system.public_router)
    app.include_router(metrics.router, dependencies=[AUTH], responses=unauthorized)
    app.include_router(tokens.router, responses=unauthorized)
    app.include_router(webhooks.router, responses=unauthorized)
    dashboard.mount_dashboard(app)
    match_whole_paths(app.router.routes)
    app.state.metrics = ServiceMetrics()
    # The Host check comes before any route or token check (the request id, the security
    # headers and JSON errors wrap everything: TrainctlApi.build_middleware_stack).
    app.add_middleware(HostAllowList, allowed=settings.host_allow_list)
    return app
