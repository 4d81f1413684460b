"""Evaluation measures: effectiveness (ir-measures), efficiency (FLOPs, eq. 1 of D2S),
sparsity, semantic deviation (Exact@k / Semantic@k, eq. 2-3), faithfulness and significance.

Every function works on in-memory data (dicts, CSR matrices, arrays) so it can be tested
against hand-computed examples; `mmsparse eval` / `mmsparse inspect` wire them to files.
"""

from .effectiveness import EvalResult, evaluate_run, parse_measures
from .efficiency import flops, flops_brute_force, max_df, posting_lengths, row_nnz, sparsity_stats, term_df
from .semantics import (caption_term_ids, doc_caption_terms, doc_exact_at_k, doc_faithfulness, embeddings_source,
                        exact_semantic_at_k, load_static_embeddings, resolve_tokenizer, tokenize_captions)
from .terms import df_table, display_term, explain_pair
from .compare import bonferroni, overlap_at_k, overlap_histogram, paired_ttest, pearson_per_query, power_law_exponent, power_law_fit

__all__ = [
    "EvalResult", "evaluate_run", "parse_measures",
    "flops", "flops_brute_force", "max_df", "posting_lengths", "row_nnz", "sparsity_stats", "term_df",
    "caption_term_ids", "doc_caption_terms", "doc_exact_at_k", "doc_faithfulness", "embeddings_source", "exact_semantic_at_k", "load_static_embeddings",
    "resolve_tokenizer", "tokenize_captions",
    "df_table", "display_term", "explain_pair",
    "bonferroni", "overlap_at_k", "overlap_histogram", "paired_ttest", "pearson_per_query", "power_law_exponent", "power_law_fit",
]
