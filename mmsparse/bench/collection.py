"""The search benchmark's large collections, from the real encoder (issues 17, 25), and their figures.

    python -m mmsparse.bench.collection dense --views VIEWS.h5 [VIEWS2.h5 ...] --originals TEST-IMAGES.h5
        -o DIR [--max-views 0] [--size 123000] [--mixture 877000] [--check N]
    python -m mmsparse.bench.collection figures --queries Q.h5 -o FIG.json NAME=SPARSE.h5[#views] ...

writes, all dense HDF5 (head-independent; `mmsparse sparsify HEAD` makes the sparse ones):
  DIR/123k.dense.h5         `size` documents: the original test images (their own ids, so the qrels
                            hold), then the encoded views (bench.views) of NON-test images (see
                            "Distractors"), then draws of the view mixture model below (ids
                            "mix<n>") to fill the collection to `size` documents. The Flickr8k
                            example: 1,000 test images + 40,000 real views + 82,000 draws.
  DIR/1m.dense.h5           the same rows followed by `mixture` more draws of the same stream (the
                            example: 877,000, 1,000,000 documents in all)
  DIR/mixture-check.dense.h5  `check` draws with another seed (default: as many as the real views),
                            to compare with the real views after sparsification (same statistics,
                            same head)
  DIR/mixture.npz           the fitted model (means, covariance factors, weights)
  DIR/collections.json      what each file holds: originals, real views, draws, documents

Draws. Draw i of a seed comes from chunk i // 65,536 of that seed's stream (the chunk's own
random generator), so a draw is the same whatever the collection's size: 1m.dense.h5 holds
123k.dense.h5's rows and continues its draws, and a larger `size` keeps the smaller one's.

Distractors. The qrels are the original test images and every view is a distractor, so no view
may show a test image: a view of a relevant image is a near-duplicate of it, scores about as
high for the image's captions, and buries the one relevant document (R@10 of every engine fell
from 12 at 1,000 documents to 0-0.4 at 123k when the views were made from all 8,091 images).
The builder drops every view whose id names an original (single views "<image>#...", collages
"<a>+<b>#...": either part), then keeps the first `max_views` of the remaining views in file
order (0 = all; never more than `size` leaves room for). Views made with `bench.views
--exclude-split test` show no test image in the first place.

The view mixture model (`ViewMixture`). Every view costs a pass of the backbone's image tower,
so the collections hold as many real views as the machine's budget allows and are filled with
documents drawn from a Gaussian mixture fitted to the encoded views' dense vectors z of the kept
views only (unit vectors, d = 512; no test image and no view of one enters the fit), then
L2-normalised like the encoder's output:
  single views of image a   z ~ N(mu_a, S_s)           mu_a = mean of a's single views
  collage of images a, b    z ~ N(unit(mu_a + mu_b) + m_c, S_c)
  a drawn uniformly from the images with a single view; (a, b) uniformly from pairs of distinct
  images; collage with probability p_c = the views' collage share.
S_s is the pooled within-image covariance of the single views (residuals z - mu_a, each image's
residuals scaled by sqrt(n_a / (n_a - 1)) for the mean they were fitted with); m_c and S_c are the
mean and covariance of the collage residuals z - unit(mu_a + mu_b). So a drawn document is "one
more view" of a real image or of a new two-image scene: its dense vector has the real
within-image spread, and the head turns it into sparse terms as it would a real view. What it
does not keep: non-Gaussian structure of the spread (e.g. crops that lose the subject). The
statistics in `collection_stats` of the sparsified check sample are reported beside the real
views' (docs/search-benchmark.md).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..metrics.efficiency import flops, max_df, row_nnz, term_df


# ---------------------------------------------------------------- figures

def collection_stats(docs: sp.csr_matrix, queries: sp.csr_matrix | None = None, vocab=None) -> dict:
    """The collection figures of issue 17, plus FLOPs against `queries`.

    docs: CSR [N, |V|] float32 >= 0; queries: CSR [nq, |V|] or None; vocab: |V| strings or None.
    Keys: docs, nnz, doc_terms (mean non-zeros per document), doc_terms_p10/_median/_p90/_max,
    active_terms, postings_p50/_p90/_p99/_max (posting-list lengths = df of the active terms),
    df_fraction_p99 (99th percentile of df/N), top_term_share (max_t df_t / N: the share of
    documents holding the most common term) and top_term, weight_mean, weight_p99; with
    queries: flops (D2S eq. 1: mean shared terms per query-document pair) and postings_per_query
    (= flops x N: the postings an exhaustive scorer touches per query).
    """
    docs = sp.csr_matrix(docs)
    n = docs.shape[0]
    lens = row_nnz(docs)
    df = term_df(docs)
    act = df[df > 0]

    def pct(x, p):
        return float(np.percentile(x, p)) if x.size else 0.0

    out = {"docs": int(n), "nnz": int(docs.nnz),
           "doc_terms": float(lens.mean()) if lens.size else 0.0,
           "doc_terms_p10": pct(lens, 10), "doc_terms_median": pct(lens, 50), "doc_terms_p90": pct(lens, 90),
           "doc_terms_max": float(lens.max()) if lens.size else 0.0,
           "active_terms": int(act.size),
           "postings_p50": pct(act, 50), "postings_p90": pct(act, 90), "postings_p99": pct(act, 99),
           "postings_max": float(act.max()) if act.size else 0.0,
           "df_fraction_p99": pct(act / max(n, 1), 99),
           "weight_mean": float(docs.data.mean()) if docs.nnz else 0.0,
           "weight_p99": pct(docs.data, 99)}
    share, term, _ = max_df(docs, vocab if vocab is not None else [str(i) for i in range(docs.shape[1])])
    out["top_term_share"], out["top_term"] = share, term
    if queries is not None:
        f = flops(queries, docs)
        out["flops"] = f
        out["postings_per_query"] = f * n
    return out


# ---------------------------------------------------------------- the view mixture model

def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (float32; zero rows stay zero)."""
    nrm = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.where(nrm > 0, nrm, 1)).astype(np.float32)


def sqrt_psd(cov: np.ndarray) -> np.ndarray:
    """L with L @ L.T = cov for a symmetric PSD matrix (eigenvalues clipped at 0), float32."""
    w, v = np.linalg.eigh(cov.astype(np.float64))
    return (v * np.sqrt(np.clip(w, 0, None))).astype(np.float32)


@dataclass
class ViewMixture:
    """The fitted view mixture (see module docstring).

    means [A, d] float32 (images with a single view), images [A] int (their dataset indices),
    single_root [d, d] (S_s = L L^T), collage_mean [d], collage_root [d, d], collage_share float,
    all_means [n_img, d] float32 (NaN rows for images without a single view; collages use
    images with a mean only).
    """

    means: np.ndarray
    images: np.ndarray
    single_root: np.ndarray
    collage_mean: np.ndarray
    collage_root: np.ndarray
    collage_share: float

    @classmethod
    def fit(cls, z: np.ndarray, sources: np.ndarray) -> "ViewMixture":
        """Fit to view vectors z [N, d] float32 with sources [N, 2] int (second -1 = single view).

        Raises ValueError when no image has two single views (no within-image spread to fit)."""
        z = np.asarray(z, dtype=np.float64)
        sources = np.asarray(sources)
        single = sources[:, 1] < 0
        a = sources[single, 0]
        imgs, inv, cnt = np.unique(a, return_inverse=True, return_counts=True)
        d = z.shape[1]
        sums = np.zeros((len(imgs), d))
        np.add.at(sums, inv, z[single])
        means = sums / cnt[:, None]
        res = z[single] - means[inv]
        keep = cnt[inv] >= 2
        if not keep.any():
            raise ValueError("no image has two single views: the within-image spread cannot be fitted")
        res = res[keep] * np.sqrt(cnt[inv][keep] / (cnt[inv][keep] - 1))[:, None]
        s_single = res.T @ res / len(res)
        pos = {int(i): j for j, i in enumerate(imgs)}
        col = sources[~single]
        ok = np.array([int(x) in pos and int(y) in pos for x, y in col], dtype=bool) if len(col) else np.zeros(0, bool)
        if ok.sum() >= 2:
            ca = np.array([pos[int(x)] for x in col[ok, 0]])
            cb = np.array([pos[int(y)] for y in col[ok, 1]])
            r = z[~single][ok] - unit(means[ca] + means[cb])
            m_c = r.mean(axis=0)
            s_c = np.cov(r, rowvar=False)
        else:
            m_c, s_c = np.zeros(d), s_single
        return cls(means.astype(np.float32), imgs, sqrt_psd(s_single), m_c.astype(np.float32), sqrt_psd(s_c),
                   float((~single).mean()))

    def sample(self, n: int, seed: int = 0, start: int = 0, chunk: int = 65536):
        """Yield (kind [m] int8: 0 single / 1 collage, vectors [m, d] float32 unit) chunks of the
        draws start .. start + n - 1 of seed's stream. Draw i belongs to chunk i // `chunk`, made
        by its own generator (seed, i // chunk), so it is the same whatever n and start."""
        end = start + n
        for c in range(start // chunk, -(-end // chunk)):
            lo, hi = max(start - c * chunk, 0), min(end - c * chunk, chunk)
            kind, vec = self._chunk(np.random.default_rng([seed, c]), chunk)
            yield kind[lo:hi], vec[lo:hi]

    def _chunk(self, rng, m: int) -> tuple[np.ndarray, np.ndarray]:
        """m draws of one generator: (kind [m] int8, unit vectors [m, d] float32)."""
        A, d = self.means.shape
        coll = rng.random(m) < self.collage_share
        out = np.empty((m, d), dtype=np.float32)
        ns = int((~coll).sum())
        if ns:
            a = rng.integers(0, A, ns)
            out[~coll] = self.means[a] + rng.standard_normal((ns, d), dtype=np.float32) @ self.single_root.T
        nc = m - ns
        if nc:
            a = rng.integers(0, A, nc)
            b = rng.integers(0, A - 1, nc)
            b += b >= a
            out[coll] = (unit(self.means[a] + self.means[b]) + self.collage_mean
                         + rng.standard_normal((nc, d), dtype=np.float32) @ self.collage_root.T)
        return coll.astype(np.int8), unit(out)

    def save(self, path: Path, recipe: str = "") -> None:
        np.savez(path, means=self.means, images=self.images, single_root=self.single_root,
                 collage_mean=self.collage_mean, collage_root=self.collage_root,
                 collage_share=np.float64(self.collage_share), recipe=np.str_(recipe))

    @classmethod
    def load(cls, path: Path) -> "ViewMixture":
        f = np.load(path)
        return cls(f["means"], f["images"], f["single_root"], f["collage_mean"], f["collage_root"],
                   float(f["collage_share"]))


# ---------------------------------------------------------------- dense collections

def _attrs(src_attrs: dict, dataset: str) -> dict:
    keep = ("backbone", "model", "model_fingerprint", "normalized")
    return {"modality": "image", **{k: src_attrs[k] for k in keep if k in src_attrs}, "dataset": dataset,
            "split": "bench"}


def view_images(view_id: str) -> list[str]:
    """The image ids a view shows: "<a>#v3" -> [a]; "<a>+<b>#c1" -> [a, b]; an original's id -> [id]."""
    return view_id.split("#", 1)[0].split("+")


def load_views(views: list[Path], exclude: set[str], max_views: int = 0):
    """(ids, vectors [n, d] float32, sources [n, 2] int32, report) of the views of one or more
    bench.views files, in file order, without every view that shows an image of `exclude` (either
    part of a collage), capped at the first `max_views` kept views (0 = all).

    report: per file {"file", "views", "dropped" (showing an excluded image), "kept"}.
    Raises InputError on duplicate view ids across files (use another --seed for the second set).
    """
    import h5py

    from ..errors import InputError
    from ..formats.dense import read_dense

    ids, vecs, srcs, report, seen = [], [], [], [], set()
    left = max_views or None
    for path in views:
        v = read_dense(path)
        with h5py.File(path, "r") as f:
            if "sources" not in f:
                raise InputError(f"{path}: sources: missing; make the views with mmsparse.bench.views")
            src = f["sources"][()]
        keep = np.array([not any(i in exclude for i in view_images(x)) for x in v.ids], dtype=bool)
        rows = np.flatnonzero(keep)
        if left is not None:
            rows = rows[:left]
            left -= len(rows)
        dup = seen.intersection(v.ids[r] for r in rows)
        if dup:
            raise InputError(f"{path}: ids: view id {sorted(dup)[0]!r} is also in an earlier views file; "
                             "make the second set with another --seed")
        seen.update(v.ids[r] for r in rows)
        ids += [v.ids[r] for r in rows]
        vecs.append(v.vectors[rows])
        srcs.append(src[rows])
        report.append({"file": Path(path).name, "views": len(v.ids), "dropped": int((~keep).sum()), "kept": len(rows)})
    return ids, np.concatenate(vecs), np.concatenate(srcs).astype(np.int32), report


MIXTURE_STREAM = "chunk-seeded v2"   # how draws are made (ViewMixture.sample); part of the recipe


def write_collections(views: Path | list[Path], originals: Path, out: Path, size: int = 0,
                      mixture: int = 877_000, check: int | None = None, seed: int = 0, max_views: int = 0,
                      log=print) -> dict:
    """Write the dense collections of the module docstring into `out`; returns their paths and
    what each holds ("counts": name -> {"originals", "views", "draws", "docs"}).

    views: one or more bench.views files; views showing an image of `originals` are dropped (see
    "Distractors"), then the first `max_views` kept (0 = all), at most size - len(originals).
    size: documents of 123k.dense.h5, the rest after originals and views drawn from the mixture
    (0 = no draws: originals + views). mixture: draws 1m.dense.h5 adds (0 = no 1m file). check:
    draws of mixture-check.dense.h5 (None = as many as the kept views, 0 = none). Files that
    exist and were made with the same recipe (views files and their sizes, originals, the model
    fingerprints, max_views, size, mixture, check, seed) are kept; others are rebuilt. Memory:
    the kept views' vectors plus one chunk of draws.
    """
    from ..formats.dense import DenseWriter, read_dense, read_dense_attrs

    from ..checks import check_compatible
    from ..errors import InputError

    views = [Path(views)] if isinstance(views, (str, Path)) else [Path(v) for v in views]
    out.mkdir(parents=True, exist_ok=True)
    va = read_dense_attrs(views[0])
    oa = read_dense_attrs(originals)
    for vf in views:
        try:  # the model compared by what it is (model_fingerprint), as every stage does
            check_compatible(read_dense_attrs(vf), oa, ("backbone", "model"), str(vf), str(originals),
                             "encode the views and the originals with one encoder")
        except InputError as e:
            raise SystemExit(str(e)) from None
    orig = read_dense(originals)
    if size and size <= len(orig.ids):
        raise SystemExit(f"--size {size}: must exceed the {len(orig.ids)} originals (or be 0: no draws)")
    cap = size - len(orig.ids) if size else 0
    keep = min(max_views, cap) if max_views and cap else (max_views or cap)
    r = {"views": [[vf.name, vf.stat().st_size] for vf in views],
         "originals": [originals.name, originals.stat().st_size], "max_views": keep, "size": size,
         "mixture": mixture, "check": check, "seed": seed, "exclude": "originals", "stream": MIXTURE_STREAM}
    fps = [read_dense_attrs(f).get("model_fingerprint") for f in [*views, originals]]
    if any(fps):  # a file re-encoded by a model changed in place has the same size: its model tells
        r["model_fingerprints"] = fps
    recipe = json.dumps(r)
    paths = {"123k": out / "123k.dense.h5", "1m": out / "1m.dense.h5", "check": out / "mixture-check.dense.h5",
             "model": out / "mixture.npz"}
    for p in paths.values():  # made with another recipe (e.g. another number of views): rebuild
        if p.is_file() and _recipe_of(p) != recipe:
            log(f"{p.name}: made with another recipe; rebuilding")
            p.unlink()
    t0 = time.time()
    ids, z, src, report = load_views(views, set(orig.ids), keep)
    for rep in report:
        log(f"views {rep['file']}: {rep['views']} views, {rep['dropped']} show a test image (dropped), "
            f"{rep['kept']} kept")
    fill = size - len(orig.ids) - len(ids) if size else 0
    check = len(ids) if check is None else check
    counts = {"123k": {"originals": len(orig.ids), "views": len(ids), "draws": fill}}
    if mixture:
        counts["1m"] = {"originals": len(orig.ids), "views": len(ids), "draws": fill + mixture}
    if check:
        counts["mixture-check"] = {"originals": 0, "views": 0, "draws": check}
    for c in counts.values():
        c["docs"] = sum(c.values())
    info = {"collection_recipe": recipe, "views_report": json.dumps(report)}
    if not paths["model"].is_file():
        mix = ViewMixture.fit(z, src)
        mix.save(paths["model"], recipe)
        log(f"mixture: fitted to {len(ids)} views in {time.time() - t0:.1f} s "
            f"({len(mix.means)} image means, collage share {mix.collage_share:.3f})")
    mix = ViewMixture.load(paths["model"])
    dim = mix.means.shape[1]

    def append_draws(w, n, seed_, start, prefix):
        s = start
        for _, vec in mix.sample(n, seed=seed_, start=start):
            w.append([f"{prefix}{i:07d}" for i in range(s, s + len(vec))], vec)
            s += len(vec)

    def write(name, dataset, draws, seed_, base=True):
        attrs = {**_attrs(va, dataset), **info, "mixture_seed": seed_,
                 **{f"bench_{k}": v for k, v in counts[name].items()}}
        with DenseWriter(paths["check" if name == "mixture-check" else name], dim, attrs) as w:
            if base:
                w.append(orig.ids, orig.vectors)
                for s in range(0, len(ids), 65536):
                    w.append(ids[s:s + 65536], z[s:s + 65536])
            append_draws(w, draws, seed_, 0, "mix" if base else "chk")
        log(f"wrote {name}: {counts[name]}")

    if not paths["123k"].is_file():
        write("123k", "flickr8k-views-123k", fill, seed)
    if mixture and not paths["1m"].is_file():
        write("1m", "flickr8k-views-1m", fill + mixture, seed)
    if check and not paths["check"].is_file():
        write("mixture-check", "flickr8k-views-mixture-check", check, seed + 1, base=False)
    (out / "collections.json").write_text(json.dumps({"counts": counts, "recipe": r}, indent=1))
    return {**{k: str(p) for k, p in paths.items()}, "counts": counts}


def _recipe_of(path: Path) -> str | None:
    """The collection_recipe a file of write_collections was made with (None: older file)."""
    if path.suffix == ".npz":
        f = np.load(path)
        return str(f["recipe"]) if "recipe" in f.files else None
    import h5py

    with h5py.File(path, "r") as f:
        r = f.attrs.get("collection_recipe")
    return None if r is None else str(r)


FIGURE_KEYS = ("docs", "doc_terms", "doc_terms_median", "doc_terms_p90", "active_terms", "postings_p50",
               "postings_p90", "postings_p99", "postings_max", "top_term_share", "top_term", "flops",
               "postings_per_query")


def figures(collections: dict[str, str], queries: Path, out: Path | None = None) -> dict:
    """collection_stats of each named sparse file against the expanded queries `queries`.

    collections: name -> path, or path + "#views" for only the rows whose id holds '#' (the encoded
    views of bench.views, without the original images). Writes OUT (.json, and .md beside it).
    """
    from ..formats.sparse import read_sparse

    q = read_sparse(queries)
    res = {}
    for name, spec in collections.items():
        path, _, sel = spec.partition("#")
        c = read_sparse(path)
        if c.vocab != q.vocab:
            raise SystemExit(f"{path}: vocabulary differs from {queries}'s; sparsify both with the same head")
        m = c.matrix
        if sel == "views":
            m = m[[i for i, x in enumerate(c.ids) if "#" in x]]
        res[name] = {"file": Path(path).name + (f"#{sel}" if sel else ""), **collection_stats(m, q.matrix, c.vocab)}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1))
        lines = ["| figure | " + " | ".join(res) + " |", "|---|" + "---:|" * len(res)]
        for k in FIGURE_KEYS:
            cells = []
            for v in res.values():
                x = v.get(k)
                cells.append(f"{x:.4g}" if isinstance(x, float) else str(x))
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return res


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m mmsparse.bench.collection", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dense", help="write the dense collections and the fitted mixture model")
    d.add_argument("--views", type=Path, nargs="+", required=True,
                   help="views.h5 file(s) of mmsparse.bench.views; views showing an original are dropped")
    d.add_argument("--max-views", type=int, default=0, help="real views kept (the first, in file order; 0 = all "
                   "that --size leaves room for)")
    d.add_argument("--originals", type=Path, required=True, help="dense test images (the qrels' documents)")
    d.add_argument("-o", "--out", type=Path, required=True, help="output directory")
    d.add_argument("--size", type=int, default=123_000, help="documents of 123k.dense.h5: the originals, the real "
                   "views, then mixture draws to fill it (0 = no draws)")
    d.add_argument("--mixture", type=int, default=877_000, help="more draws 1m.dense.h5 adds to 123k.dense.h5's rows "
                   "(0 = no 1m file)")
    d.add_argument("--check", type=int, default=None, help="draws of mixture-check.dense.h5 (another seed), to "
                   "compare with the real views (default: as many as the real views kept)")
    d.add_argument("--seed", type=int, default=0)
    f = sub.add_parser("figures", help="collection figures of sparse files against the test queries")
    f.add_argument("--queries", type=Path, required=True, help="expanded sparse queries")
    f.add_argument("-o", "--out", type=Path, required=True, help="JSON output (+ .md)")
    f.add_argument("collections", nargs="+", help="NAME=SPARSE.h5 or NAME=SPARSE.h5#views")
    a = p.parse_args(argv)
    if a.cmd == "dense":
        print(json.dumps(write_collections(a.views, a.originals, a.out, size=a.size, mixture=a.mixture, check=a.check,
                                            seed=a.seed, max_views=a.max_views), indent=1))
    else:
        res = figures(dict(x.split("=", 1) for x in a.collections), a.queries, a.out)
        print(a.out.with_suffix(".md").read_text())
        del res


if __name__ == "__main__":
    main()
