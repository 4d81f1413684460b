"""The search web application: a FastAPI app over one or two QueryEngines (mmsparse.api.querying).

    from mmsparse.serve import create_app, run_server
    app = create_app("work/index/d2s", dense_index="work/index/dense", image_root="images/")
    run_server(app, host="127.0.0.1", port=8000)

Routes (the OpenAPI page at /docs documents them, the schema is /openapi.json):
  GET /                  the search page (static/index.html, app.js, style.css)
  GET /search            q (1..max_query_chars characters), k (1..max_k), mode (sparse | dense),
                         exclude (terms to drop, repeatable), add (words to add, repeatable) ->
                         SearchResponse: the query's terms and the top-k with their shared terms
  GET /image/{id}        the image file of a result (images.safe_image_path: only inside the root)
  GET /info              what is served: index kinds, sizes, head, backbone, model, limits
Errors are JSON {"error": message, "status": code} with that HTTP status (400 bad input, 404
unknown image or route, 422 a parameter out of bounds, 500 internal).

The models and indexes load once, in create_app; requests share them under one lock (a CPU
runs one query at a time anyway). An inference-free head's index loads no model at all: its
queries are the head's term-weight table (api/querying.py TableQueryEncoder); /info and the
page say which query encoder answers. Encoded query texts are cached (least recently used,
`cache_size` texts), so dropping or adding a term re-searches without re-encoding.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Optional
from urllib.parse import quote

from ..errors import InputError

STATIC = Path(__file__).resolve().parent / "static"
STATIC_FILES = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
MAX_EDITS = 64          # exclude / add entries per request
MAX_TERM_CHARS = 64


def create_app(index: str | Path, *, dense_index: str | Path | None = None, image_root: str | Path | None = None,
               head: str | None = None, backbone: str | None = None, model: str | None = None,
               device: str = "cpu", query_mode: str | None = None, force: bool = False, max_k: int = 100,
               max_query_chars: int = 300, cache_size: int = 256, threads: int = 1, runtime: str = "auto",
               progress=None):
    """The FastAPI app serving `index` (and `dense_index`, a dense index searched side by side),
    with thumbnails from `image_root` (default: the image folder the index's documents were
    encoded from, when its provenance names one that exists). head / backbone / model /
    query_mode / force / device as in mmsparse.api.querying.QueryEngine (they apply to `index`;
    the dense index uses its own provenance). max_k bounds k, max_query_chars the query length.
    threads: torch CPU threads while encoding and search threads (default 1: requests run one at
    a time, and one thread keeps latency low on a machine with other work). runtime: what runs the
    towers (torch | onnx | auto, QueryEncoder).
    Loads everything now; raises InputError for bad inputs (e.g. two dense indexes, a missing
    image root)."""
    from fastapi import FastAPI, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
    from starlette.exceptions import HTTPException

    from ..api.querying import QueryEngine
    from ..metrics import display_term
    from .images import MEDIA_TYPES, safe_image_path
    from .models import HealthInfo, SearchResponse

    if not 1 <= max_k <= 10_000:
        raise InputError(f"--max-k {max_k}: must be in 1..10000")
    lock, backbones = threading.RLock(), {}
    main = QueryEngine(index, head=head, backbone=backbone, model=model, device=device, query_mode=query_mode,
                       force=force, threads=threads, encode_threads=threads, backbones=backbones, lock=lock,
                       progress=progress, runtime=runtime)
    engines = {main.route: main}
    if dense_index is not None:
        dense = QueryEngine(dense_index, device=device, threads=threads, encode_threads=threads,
                            backbones=backbones, lock=lock, progress=progress, runtime=runtime)
        if dense.route != "dense" or main.route != "sparse":
            raise InputError(f"--dense-index {dense_index}: give a sparse INDEX and a dense (Faiss) --dense-index; "
                             f"got {main.kind} and {dense.kind}")
        engines["dense"] = dense
    root = Path(image_root) if image_root is not None else main.origin.image_root
    if image_root is not None and not root.is_dir():
        raise InputError(f"{root}: --image-root is not a directory")
    known = set(main.ids) if main.ids is not None else None
    for e in engines.values():
        if e.ids is not None and known is not None:
            known |= set(e.ids)
    cache: OrderedDict = OrderedDict()

    app = FastAPI(title="mmsparse search", version=_version(),
                  description="Learned sparse retrieval over images: free-text queries, their expanded terms (drop "
                              "or add terms and search again), the terms each result shares with the query, and "
                              "dense results side by side. Errors are JSON {error, status}.")
    app.state.engines, app.state.image_root = engines, root

    def error(status: int, message: str, **extra) -> JSONResponse:
        return JSONResponse({"error": message, "status": status, **extra}, status_code=status,
                            headers={"X-Content-Type-Options": "nosniff"})

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        parts = [f"{'.'.join(str(x) for x in e.get('loc', [])[1:]) or 'request'}: {e.get('msg')}" for e in exc.errors()]
        return error(422, "; ".join(parts))

    @app.exception_handler(InputError)
    async def _bad(request: Request, exc: InputError):
        return error(400, str(exc))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        return error(500, f"internal error: {type(exc).__name__}")

    @app.middleware("http")
    async def _headers(request: Request, call_next):
        resp = await call_next(request)
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        return resp

    def encoded(text: str, mode: str):
        """The query text encoded for `mode` (cached); the dense side reuses the sparse side's
        backbone vectors when both indexes share the backbone."""
        from ..api.querying import Encoded

        eng = engines[mode]
        share = mode == "dense" and "sparse" in engines and engines["sparse"].backbone is eng.backbone
        key = ("sparse" if share else mode, text)
        with lock:
            if key in cache:
                cache.move_to_end(key)
                enc = cache[key]
            else:
                enc = (engines["sparse"] if share else eng).encode([text])
                cache[key] = enc
                while len(cache) > cache_size:
                    cache.popitem(last=False)
        return Encoded(enc.ids, enc.vectors, None, enc.modality) if share else enc

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page():
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"), headers={
            "Content-Security-Policy": "default-src 'self'; img-src 'self'; object-src 'none'; base-uri 'none'; "
                                       "frame-ancestors 'none'", "Cache-Control": "no-cache"})

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no static file {name!r}")
        return Response((STATIC / name).read_bytes(), media_type=STATIC_FILES[name],
                        headers={"Cache-Control": "no-cache"})

    @app.get("/info", response_model=HealthInfo, summary="What is served")
    def info():
        """The indexes served, their sizes, the head, backbone and model, what encodes their queries
        (query_encoder; model_loaded false for an inference-free head's table), and the request limits."""
        def one(e):
            n = e.origin.index_meta.get("num_docs")
            return {"index": str(e.index_dir), "kind": e.kind, "documents": int(n) if n is not None else None,
                    "head": e.origin.head, "method": e.method, "vocab_size": len(e.vocab) if e.vocab is not None else None,
                    "backbone": e.origin.backbone, "model": e.origin.model, "query_encoder": e.encoder.description,
                    "model_loaded": e.backbone is not None, "load_seconds": round(e.load_seconds, 2)}
        return {"modes": list(engines), "default_mode": main.route, "indexes": {m: one(e) for m, e in engines.items()},
                "max_k": max_k, "max_query_chars": max_query_chars, "images": root is not None}

    @app.get("/search", response_model=SearchResponse, summary="Search with a free-text query",
             responses={400: {"description": "bad input (e.g. an added word not in the vocabulary)"},
                        422: {"description": "a parameter out of bounds"}})
    def search(q: str = Query(..., min_length=1, max_length=max_query_chars, description="The query text."),
               k: int = Query(10, ge=1, le=max_k, description="Results to return."),
               mode: Optional[str] = Query(None, pattern="^(sparse|dense)$", description="sparse (the learned "
                                           "sparse index) or dense (the --dense-index); default: the index's."),
               exclude: list[str] = Query([], description="Query terms to drop before searching (sparse; "
                                          "repeatable)."),
               add: list[str] = Query([], description="Words whose terms are added at the query's largest "
                                      "weight (sparse; repeatable)."),
               shared: int = Query(12, ge=0, le=1000, description="Shared terms listed per result (the largest "
                                   "contributions).")):
        """The top-k images for `q`: for sparse search, the query's own (expanded) terms after the
        edits, and under each result the terms it shares with the query with their contributions
        q_t x d_t (their sum is the inner product); for dense search, the cosine scores."""
        t0 = time.perf_counter()
        mode = mode or main.route
        if mode not in engines:
            raise HTTPException(400, f"mode {mode!r}: not served; this server has {', '.join(engines)}")
        if not q.strip():
            raise HTTPException(422, "q: the query is blank")
        if len(exclude) > MAX_EDITS or len(add) > MAX_EDITS or any(len(t) > MAX_TERM_CHARS for t in [*exclude, *add]):
            raise HTTPException(422, f"exclude/add: at most {MAX_EDITS} entries of at most {MAX_TERM_CHARS} characters")
        eng = engines[mode]
        edits = (exclude, add) if mode == "sparse" else ((), ())
        r = eng.results(encoded(q, mode), [q], k, *edits)[0]
        for t in r["terms"]:
            t["display"] = display_term(t["term"])
        for hit in r["results"]:
            hit["image"] = f"/image/{quote(hit['id'], safe='/')}" if root is not None else None
            hit["shared"] = hit["shared"][:shared]
            for s in hit["shared"]:
                s["display"] = display_term(s["term"])
        return {**r, "mode": mode, "k": k, "index": eng.kind, "took_ms": round(1000 * (time.perf_counter() - t0), 2)}

    @app.get("/image/{image_id:path}", summary="The image of a result",
             responses={200: {"content": {"image/jpeg": {}}}, 404: {"description": "no such image"}})
    def image(image_id: str):
        """The image file of an indexed id, only from inside the image root (no `..`, absolute
        paths or symlinks out of the root: 404)."""
        path = safe_image_path(root, image_id, known) if root is not None else None
        if path is None:
            raise HTTPException(404, "no such image")
        return FileResponse(path, media_type=MEDIA_TYPES.get(path.suffix.lower(), "application/octet-stream"),
                            headers={"Cache-Control": "max-age=3600"})

    return app


def _version() -> str:
    from .._version import __version__

    return __version__


def run_server(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
               access_log: bool = False) -> None:
    """Serve `app` with uvicorn on host:port until interrupted (Ctrl-C / SIGTERM stop it cleanly).
    At most 64 requests are handled at once; more get 503."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=access_log, limit_concurrency=64,
                timeout_keep_alive=5)
