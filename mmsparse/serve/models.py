"""The JSON shapes of the search API (pydantic models: FastAPI validates responses with them and
documents them on the OpenAPI page)."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field


class Term(BaseModel):
    """One term of the searched query."""

    term: str = Field(description="The vocabulary term (raw; WordPiece continuations start with ##).")
    display: str = Field(description="The term as shown: '##oot' becomes '-oot'.")
    weight: float = Field(description="Its query weight q_t (>= 0).")


class Shared(BaseModel):
    """A term a result shares with the query."""

    term: str
    display: str
    query_weight: float = Field(description="q_t")
    doc_weight: float = Field(description="d_t, the image's weight as indexed")
    contribution: float = Field(description="q_t x d_t; the contributions sum to the inner product <q, d>")


class Hit(BaseModel):
    """One result."""

    rank: int = Field(description="1 = best")
    id: str = Field(description="The image id")
    score: float = Field(description="The engine's score (PISA: quantised ~ <q, d>; dense: <q, d>)")
    image: Optional[str] = Field(description="URL of the image (GET /image/{id}); null without an image root")
    shared: list[Shared] = Field(description="Shared terms, largest contribution first (sparse search)")


class SearchResponse(BaseModel):
    """The answer of GET /search."""

    query: str
    mode: str = Field(description="sparse or dense")
    index: str = Field(description="The engine of the searched index (pisa, seismic, faiss, milvus)")
    k: int
    modality: str
    terms: list[Term] = Field(description="The searched sparse query after the edits, largest weight first")
    excluded: list[str]
    added: list[str]
    results: list[Hit]
    took_ms: float = Field(description="Server time of this request, milliseconds")


class IndexInfo(BaseModel):
    index: str
    kind: str
    documents: Optional[int]
    head: Optional[str]
    method: Optional[str]
    vocab_size: Optional[int]
    backbone: str = Field(description="The backbone of the documents' vectors ('' when not recorded)")
    model: str
    query_encoder: str = Field(description="What encodes a query: 'backbone NAME (MODEL) + METHOD head', or "
                               "'term-weight table (inference-free, no model)'")
    model_loaded: bool = Field(description="Whether a model was loaded to encode queries (false for a table)")
    load_seconds: float


class HealthInfo(BaseModel):
    """The answer of GET /info."""

    modes: list[str]
    default_mode: str
    indexes: dict[str, IndexInfo]
    max_k: int
    max_query_chars: int
    images: bool = Field(description="Whether GET /image serves thumbnails")
