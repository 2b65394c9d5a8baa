"""The fixture KG server's HTTP application: one FastAPI route per endpoint, the organisers' request bodies and
replies, and with `faults` the odd argument values that trigger failures (the package's docstring)."""


from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from loguru import logger
from pydantic import ValidationError

from evaluation.kg_fixture.graph import BODIES, FAULTS, KnowledgeGraph
from models.kg.client import ENDPOINTS


def read_body(name: str, raw: bytes) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """(the fields of a request body to endpoint `name`, None), or ({}, FastAPI's 422 detail) when the body does
    not fit the endpoint's request model (theirs: pydantic's validation, with its coercions)."""
    model = BODIES[name]
    if model is None:
        return {}, None
    try:
        return model.model_validate_json(raw or b"").model_dump(), None
    except ValidationError as err:
        return {}, [{"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"]} for e in err.errors()]


def answer(function: Callable[..., Any], name: str, values: dict[str, Any]) -> tuple[int, Any]:
    """(200, {"result": ...}) from an endpoint's function, or (500, "Internal Server Error") when it raises: theirs
    lets the exception through and uvicorn answers HTTP 500."""
    try:
        return 200, {"result": function(**values)}
    except Exception as err:  # noqa: BLE001 - any error of the endpoint is the 500 reply their server gives
        logger.debug("KG fixture {}({}) raised {!r}: HTTP 500", name, values, err)
        return 500, "Internal Server Error"


def create_app(folder: Path, faults: bool = False, slow_s: float = 3.0) -> FastAPI:
    graph = KnowledgeGraph(folder)
    functions = graph.functions()
    app = FastAPI(title="CRAG-compatible KG (fixtures)")

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"message": "The CRAG API service is running"}

    def route(name: str):
        endpoint = ENDPOINTS[name]

        async def handle(request: Request) -> Response:
            values, problem = read_body(name, await request.body())
            if problem is not None:
                return JSONResponse({"detail": problem}, status_code=422)
            fault = next((v for v in values.values() if faults and isinstance(v, str) and v in FAULTS), None)
            if fault == "__slow__":
                await asyncio.sleep(slow_s)
            elif fault == "__500__":
                return PlainTextResponse("Internal Server Error", status_code=500)
            elif fault == "__503__":
                return PlainTextResponse("Service Unavailable", status_code=503)
            elif fault == "__garbage__":
                return PlainTextResponse("<html>not json", media_type="application/json")
            elif fault == "__wrongtype__":
                return JSONResponse({"result": {"unexpected": True} if endpoint.returns != (dict,) else 42})
            status, content = answer(functions[name], name, values)
            return JSONResponse(content) if status == 200 else PlainTextResponse(content, status_code=status)

        handle.__name__ = name
        app.post(endpoint.path)(handle)

    for name in ENDPOINTS:
        route(name)
    return app
