"""VDR: Vocabulary Disentangled Retrieval (Zhou et al.) on frozen token / patch states.
config.py, head.py (elu1p towers, eq. 2-4), loss.py (§3.2-3.3), data.py (streaming states),
method.py (training hooks, sparsify)."""
