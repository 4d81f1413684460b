"""BM25-V: sparse-autoencoder visual words on patch features, Okapi BM25, dense rerank.
config.py, head.py (top-k SAE, eq. 3-4), data.py (streaming patches), pooling.py (eq. 6-8, §3.4),
method.py (training hooks, sparsify), table.py (Table 2)."""
