"""HTML report of queries: caption, top terms, top retrieved images with their terms, shared
terms highlighted, images inlined as base64, and (optionally) a word cloud PNG per image."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Sequence

from .terms import display_term

IMAGE_SUFFIXES = ("", ".jpg", ".jpeg", ".png", ".JPG", ".JPEG", ".PNG")
MIME = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png"}
SHARED_COLOR = "#d84315"  # shared terms in word clouds; the term lists use the yellow of .m
OTHER_COLOR = "#37474f"

CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1150px;color:#222}
.legend{font-size:90%;color:#555}
.q{border-top:2px solid #888;margin-top:1.5em;padding-top:.5em}
.q h2{margin:.2em 0;font-size:120%}.q .cap{font-size:115%;margin:.3em 0}.q .gold{font-size:85%;color:#555}
.terms span{display:inline-block;margin:1px 3px;padding:0 3px;border-radius:3px;background:#eee;font-size:90%}
.terms span.m{background:#ffd54f;font-weight:bold}
.imgs{display:flex;flex-wrap:wrap;gap:10px;margin-top:.5em}
.img{width:210px;font-size:80%;padding:4px;border:1px solid #ddd;border-radius:4px}
.img img.photo{width:210px;height:160px;object-fit:cover;display:block}
.img img.wc{width:210px;display:block;margin-top:3px;border-top:1px dashed #ccc}
.img .hd{margin:3px 0;font-weight:bold}.rel{outline:3px solid #2e7d32}.relbadge{color:#2e7d32}"""


def find_image(root: Path | None, image_id: str) -> Path | None:
    """IMAGE_ROOT/<id>[.jpg|.jpeg|.png] (ids are filename stems), or None."""
    if root is None:
        return None
    for suf in IMAGE_SUFFIXES:
        p = root / f"{image_id}{suf}"
        if p.is_file():
            return p
    return None


def _img_tag(path: Path | None) -> str:
    if path is None:
        return "<div>(no image)</div>"
    mime = MIME.get(path.suffix.lower(), "jpeg")
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img class="photo" src="data:image/{mime};base64,{data}" alt="{html.escape(path.name)}">'


def _terms(pairs: Sequence[tuple[str, float]], highlight: set[str]) -> str:
    spans = []
    for t, w in pairs:
        cls = ' class="m"' if t in highlight else ""
        spans.append(f'<span{cls} title="{html.escape(t)}">{html.escape(display_term(t))} {w:.2f}</span>')
    return '<div class="terms">' + "".join(spans) + "</div>"


WORDCLOUD_MAX_WORDS = 30  # more do not fit at a readable size in the report's 210-pixel column


def write_wordcloud(terms: Sequence[tuple[str, float]], path: str | Path, shared: set[str] = frozenset(),
                    width: int = 420, height: int = 240, max_words: int = WORDCLOUD_MAX_WORDS,
                    min_font_size: int | None = None) -> list[tuple[str, int]]:
    """A word-cloud PNG (the `wordcloud` package) of the `max_words` heaviest (term, weight) pairs,
    word size ~ weight, terms in `shared` in orange and the rest in dark grey; written atomically.
    The report shows it at half its width (210 CSS pixels for the default 420), so the smallest
    word is 20 px here (10 px on screen) and the largest at most 40 % of the height; words that
    do not fit at that size are left out rather than shrunk. Word pieces are shown as
    display_term gives them ('##oot' -> '-oot'). min_font_size: the smallest word in PNG pixels
    (default 20 per 420 pixels of width; smaller fits more words). No terms: a blank image.
    Returns the words drawn with their font size in pixels of the PNG, largest first."""
    from PIL import Image
    from wordcloud import WordCloud

    from ..atomic import atomic_path

    freqs: dict[str, float] = {}
    hot = set()
    for t, w in terms:
        if w > 0:
            d = display_term(t)
            freqs[d] = max(freqs.get(d, 0.0), float(w))
            if t in shared:
                hot.add(d)
    with atomic_path(Path(path)) as tmp:
        if not freqs:
            Image.new("RGB", (width, height), "white").save(tmp, format="PNG")
            return []
        scale = width / 420
        wc = WordCloud(width=width, height=height, background_color="white", prefer_horizontal=1.0,
                       random_state=0, relative_scaling=0.5,
                       min_font_size=min_font_size or max(8, round(20 * scale)),
                       max_font_size=round(0.4 * height), max_words=max_words, margin=round(6 * scale),
                       color_func=lambda word, **_: SHARED_COLOR if word in hot else OTHER_COLOR)
        wc.generate_from_frequencies(freqs).to_image().save(tmp, format="PNG")
    return [(word, int(size)) for (word, _), size, *_ in wc.layout_]


def render_report(entries: list[dict], title: str, subtitle: str = "") -> str:
    """HTML text. entries: one dict per query {id, text|None, terms: [(term, weight)],
    gold_rank: rank of the first relevant image in the run or None, hits: [{id, score,
    terms: [(term, weight)], shared: set of terms, image: Path|None, relevant: bool,
    wordcloud: URL relative to the HTML file or None}]}.
    Terms an image shares with the query (`shared`, from the full vectors) are highlighted (yellow,
    bold) under the image and in the query's list; relevant images get a green frame."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    if subtitle:
        parts.append(f'<p class="legend">{html.escape(subtitle)}</p>')
    parts.append('<p class="legend">Terms as <i>term weight</i>, highest first; <b style="background:#ffd54f">'
                 'yellow</b>: shared by the query and the image (their dot product sums over these); green '
                 'frame: a relevant image (qrels); word clouds: the image\'s terms sized by weight, shared '
                 f'ones in <b style="color:{SHARED_COLOR}">orange</b>. "-oot" is a word piece glued to the '
                 'previous one.</p>')
    for e in entries:
        shared = set().union(*(h.get("shared", set()) for h in e.get("hits", [])))
        parts.append(f'<div class="q"><h2>Query {html.escape(e["id"])}</h2>')
        if e.get("text"):
            parts.append(f'<p class="cap"><i>{html.escape(e["text"])}</i></p>')
        if "gold_rank" in e:
            g = e["gold_rank"]
            parts.append(f'<p class="gold">first relevant image at rank {g}</p>' if g else
                         '<p class="gold">no relevant image in the run</p>')
        parts.append(_terms(e["terms"], shared))
        if e.get("hits"):
            parts.append('<div class="imgs">')
            for rank, h in enumerate(e["hits"], 1):
                rel = " rel" if h.get("relevant") else ""
                badge = ' <span class="relbadge">relevant</span>' if h.get("relevant") else ""
                wc = (f'<img class="wc" src="{html.escape(h["wordcloud"])}" alt="word cloud of {html.escape(h["id"])}">'
                      if h.get("wordcloud") else "")
                parts.append(f'<div class="img{rel}">{_img_tag(h.get("image"))}<div class="hd">#{rank} '
                             f'{html.escape(h["id"])} ({h["score"]:.3g}){badge}</div>{wc}'
                             f'{_terms(h["terms"], h.get("shared", set()))}</div>')
            parts.append("</div>")
        parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts)
