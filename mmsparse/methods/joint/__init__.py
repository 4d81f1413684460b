"""Joint sparse-dense self-distillation (Song et al., CIKM 2025): the D2S head trained together
with copies of the backbone's final projections. config.py, head.py, loss.py (eq. 2-3), method.py."""
