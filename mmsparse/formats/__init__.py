"""File formats shared by the stages (see docs/formats.md)."""

from .dense import DenseCollection, DenseWriter, read_dense, read_dense_attrs, write_dense
from .sparse import SparseCollection, read_sparse, write_sparse
from .trec import read_qrels, read_run, write_qrels, write_run

__all__ = [
    "DenseCollection", "DenseWriter", "read_dense", "read_dense_attrs", "write_dense",
    "SparseCollection", "read_sparse", "write_sparse",
    "read_qrels", "read_run", "write_qrels", "write_run",
]
