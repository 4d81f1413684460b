"""D2S: Dense2Sparse with probabilistic expansion control (Nguyen et al.).

config.py (options), head.py (W1, LayerNorm, W2 <- word embeddings, log(1+ReLU); eq. 4-5),
loss.py (eq. 7), expansion.py (Algorithm 1, eq. 6), method.py (training hooks, sparsify),
ablation.py (the expansion x η study of Table 3 / Fig. 2a).
"""
