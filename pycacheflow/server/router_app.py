"""The HTTP app of the data-parallel router (server/router.py): its routes, and the answers of
/health, /props, /slots and /metrics gathered from every live replica (the rules are in
router.py's docstring)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pycacheflow.server.body_limit import BodyLimitMiddleware
from pycacheflow.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from pycacheflow.server.router import PUBLIC_PATHS, Router, error_response

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def create_router_app(router: Router) -> Starlette:
    """The ASGI app in front of ``router``'s replicas (call ``router.start_monitors()`` on the
    loop that serves it)."""
    from pycacheflow.server.app import ApiKeyMiddleware

    routes = [
        Route("/health", _health(router), methods=["GET"]),
        Route("/v1/health", _health(router), methods=["GET"]),
        Route("/router", _stats(router), methods=["GET"]),
        Route("/props", _props(router), methods=["GET"]),
        Route("/slots", _slots(router), methods=["GET"]),
        Route("/metrics", _metrics(router), methods=["GET"]),
        Route("/{path:path}", router.forward, methods=_METHODS),
    ]
    app = Starlette(routes=routes)
    app.state.router = router
    if router.config.api_keys:
        app.add_middleware(ApiKeyMiddleware, api_keys=router.config.api_keys,
                           public_paths=PUBLIC_PATHS)  # fmt: skip
    # the router reads a body whole before it picks a replica: the same limit as a server's
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=router.config.max_body_bytes)
    return app


def _health(router: Router) -> Callable:
    async def health(request: Request) -> Response:
        if not router.live():
            return router.none_alive()
        return JSONResponse({"status": "ok"})

    return health


def _stats(router: Router) -> Callable:
    async def stats(request: Request) -> Response:
        return JSONResponse(router.stats())

    return stats


def _props(router: Router) -> Callable:
    async def props(request: Request) -> Response:
        answers = await router.fan_out(request, "/props")
        if not answers:
            return router.none_alive()
        first = answers[0][1]
        if first.status_code != 200:
            return _passed_through(first)
        merged = first.json()
        good = [a.json() for _, a in answers if a.status_code == 200]
        merged["total_slots"] = sum(int(p.get("total_slots", 0)) for p in good)
        merged.setdefault("cacheflow", {})["data_parallel"] = {
            "num_replicas": len(router.replicas),
            "num_live": len(router.live()),
            "policy": router.policy.name,
        }
        return JSONResponse(merged)

    return props


def _slots(router: Router) -> Callable:
    async def slots(request: Request) -> Response:
        answers = await router.fan_out(request, "/slots")
        if not answers:
            return router.none_alive()
        good = [(r, a) for r, a in answers if a.status_code == 200]
        if not good:  # all refused alike (--no-slots: 501; fail_on_no_slot: 503)
            return _passed_through(answers[0][1])
        merged: list[dict[str, object]] = []
        for replica, answer in good:
            for slot in answer.json():
                slot["replica"] = replica.replica_id
                slot["replica_slot_id"] = slot.get("id")
                slot["id"] = len(merged)
                merged.append(slot)
        return JSONResponse(merged)

    return slots


def _metrics(router: Router) -> Callable:
    async def metrics(request: Request) -> Response:
        if not router.config.enable_metrics:
            return error_response("This server does not support metrics endpoint.", 501,
                          "not_supported_error")  # fmt: skip
        answers = await router.fan_out(request, "/metrics")
        texts = [(r.replica_id, a.text) for r, a in answers if a.status_code == 200]
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(router.metric_families()))
        text = merge_metrics(texts).encode() + generate_latest(registry)
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    return metrics


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def merge_metrics(texts: list[tuple[int, str]]) -> str:
    """Prometheus texts of several replicas as one: every sample gets a ``replica`` label, and
    the samples of one family stay together under its HELP and TYPE lines (the first replica's).

    Args:
        texts: (replica id, its /metrics text) in replica order.
    """
    headers: dict[str, list[str]] = {}  # family name -> HELP/TYPE lines, first seen order
    samples: dict[str, list[str]] = {}
    owner: dict[str, int] = {}  # family name -> the replica whose HELP/TYPE lines are kept
    for replica_id, text in texts:
        family = ""
        for line in text.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                family = line.split(" ", 3)[2]
                if owner.setdefault(family, replica_id) == replica_id:
                    headers.setdefault(family, []).append(line)
            elif line and not line.startswith("#"):
                headers.setdefault(family, [])
                samples.setdefault(family, []).append(_labelled(line, replica_id))
    lines: list[str] = []
    for family, header in headers.items():
        lines += header + samples.get(family, [])
    return "\n".join(lines) + ("\n" if lines else "")


def _labelled(sample: str, replica_id: int) -> str:
    """``name{a="b"} 1`` -> ``name{replica="0",a="b"} 1`` (and ``name 1`` -> ``name{...} 1``)."""
    label = f'replica="{replica_id}"'
    end = len(sample)
    for sep in ("{", " "):
        pos = sample.find(sep)
        if pos != -1:
            end = min(end, pos)
    name, rest = sample[:end], sample[end:]
    if rest.startswith("{}"):
        return f"{name}{{{label}}}{rest[2:]}"
    if rest.startswith("{"):
        return f"{name}{{{label},{rest[1:]}"
    return f"{name}{{{label}}}{rest}"


def _passed_through(answer: httpx.Response) -> Response:
    return Response(answer.content, answer.status_code,
                    media_type=answer.headers.get("content-type"))  # fmt: skip
