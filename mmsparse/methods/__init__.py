"""Training and sparsification of methods other than D2S (one module each), called by the shared
`train-head --method NAME` and `sparsify` commands."""
