"""`mmsparse serve`: a search page and a JSON API over an index (mmsparse.serve: FastAPI + uvicorn).
This module parses the options, builds the app (the model loads once, here) and runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

_MODEL = "Model (default: the index's provenance)"
_LIMITS = "Limits"


def main(
    index: Path = typer.Argument(..., help="Index directory made by `mmsparse index` (a sparse one for the term view; "
                                 "a Faiss index alone serves dense search)."),
    dense_index: Optional[Path] = typer.Option(None, "--dense-index", help="A dense (Faiss) index of the same images: "
                                               "its results are shown beside the sparse ones."),
    image_root: Optional[Path] = typer.Option(None, "--image-root", help="Folder holding <image id>.jpg (or .png, "
                                              "...) for the thumbnails; only files inside it are served (no symlinks "
                                              "out of it). Default: the image folder the documents were encoded "
                                              "from, when the index's provenance names one."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; 127.0.0.1 keeps the server on this "
                             "machine (0.0.0.0 opens it to the network: there is no authentication)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="TCP port."),
    head: Optional[str] = typer.Option(None, "--head", rich_help_panel=_MODEL, help="Head directory or Hugging "
                                       "Face hub id (default: the head the index's sparse file records)."),
    backbone: Optional[str] = typer.Option(None, "--backbone", rich_help_panel=_MODEL, help="Backbone name."),
    model: Optional[str] = typer.Option(None, "--model", rich_help_panel=_MODEL, help="Model directory or hub id."),
    query_mode: Optional[str] = typer.Option(None, "--query-mode", rich_help_panel=_MODEL, help="The head's caption "
                                             "query mode (default: the method's first, e.g. expand)."),
    device: str = typer.Option("cpu", "--device", rich_help_panel=_MODEL, help="cpu, cuda, cuda:N or auto."),
    runtime: str = typer.Option("auto", "--runtime", rich_help_panel=_MODEL, help="What runs the towers: torch, "
                                "onnx (ONNX Runtime on the CPU; the graphs are exported once per model and cached, "
                                "as encode-dense --runtime) or auto (onnx on the CPU where it exports, else torch)."),
    force: bool = typer.Option(False, "--force", rich_help_panel=_MODEL, help="Use a --head/--model other than the "
                               "one the head was trained with."),
    max_k: int = typer.Option(100, "--max-k", min=1, max=10_000, rich_help_panel=_LIMITS,
                              help="Largest k a request may ask for."),
    max_query_chars: int = typer.Option(300, "--max-query-chars", min=1, max=1000, rich_help_panel=_LIMITS,
                                        help="Longest query text a request may send, characters."),
    threads: int = typer.Option(1, "--threads", min=1, rich_help_panel=_LIMITS, help="torch CPU threads for "
                                "encoding a query, and search threads (requests run one at a time)."),
    log_level: str = typer.Option("warning", "--log-level", rich_help_panel=_LIMITS,
                                  help="uvicorn log level: critical, error, warning, info, debug."),
) -> None:
    """Serve a search page and a JSON API over INDEX: type a query, see the images, the terms each
    shares with the query (sized by contribution) and the query's own expanded terms as chips you
    can drop (or add a word) before searching again; dense results beside them with --dense-index.

    JSON API: GET /search?q=...&k=10&mode=sparse|dense (&exclude=TERM&add=WORD), GET /image/{id},
    GET /info; the OpenAPI page is /docs. The model loads once at startup (about 10 s for the
    Flickr8k dual encoder and a D2S head on a shared 2-core CPU); an inference-free head's index
    loads none (its queries are the head's term-weight table; the page says which encoder
    answers). Stop with Ctrl-C.
    """
    from ..cli_ui import RichReporter, stderr_console
    from ..serve import create_app, run_server

    app = create_app(index, dense_index=dense_index, image_root=image_root, head=head, backbone=backbone,
                     model=model, device=device, query_mode=query_mode, force=force, max_k=max_k,
                     max_query_chars=max_query_chars, threads=threads, runtime=runtime, progress=RichReporter())
    shown = f"[{host}]" if ":" in host else host
    root = app.state.image_root
    stderr_console().print(f"serving {index} on http://{shown}:{port}/ (JSON API: /search, OpenAPI: /docs; "
                           f"images: {root if root is not None else 'none (pass --image-root)'}); Ctrl-C stops",
                           markup=False, highlight=False)
    run_server(app, host=host, port=port, log_level=log_level)
