"""The dense model trained alike: the towers' final layers and projections tuned on CLIP's
contrastive loss, the baseline VDR's claim is about (VDR paper Table 2: CLIP, CLIP-BERT).
config.py, head.py, method.py."""
