"""python -m mmsparse.methods.bm25v table ...: BM25-V's Table 2 (see table.py)."""

from .table import main

main()
