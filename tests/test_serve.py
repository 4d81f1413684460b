"""`mmsparse serve` as a user runs it: the real command in a subprocess on a free loopback port,
over the real PISA and Faiss indexes of conftest `search_setup`. The JSON API answers what
`mmsparse query` answers; images come only from the image root; limits and errors are JSON; a
load test (1,000 requests, 8 at a time) has no errors; headless Chromium drives the page.
Every server and browser is stopped, and every wait is bounded."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from mmsparse.formats.sparse import read_sparse
from mmsparse.serve.images import safe_image_path

QUERIES = ["a dog running on the beach", "two children playing in the snow", "a man riding a bike",
           "a black dog swimming in the water", "people sitting at a table", "a girl in a pink dress"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def image_root(search_setup, tmp_path_factory) -> dict:
    """A copy of the indexed test images as the image root, where one indexed id is a symlink out
    of the root (must be refused), one a symlink inside it (served), plus an image the index
    does not hold."""
    root = tmp_path_factory.mktemp("images")
    ids = read_sparse(search_setup["sparse_images"]).ids
    for i in ids:
        shutil.copyfile(search_setup["images"] / f"{i}.jpg", root / f"{i}.jpg")
    out_link, in_link = ids[-1], ids[-2]
    (root / f"{out_link}.jpg").unlink()
    (root / f"{out_link}.jpg").symlink_to(search_setup["images"] / f"{out_link}.jpg")   # out of the root
    (root / f"{in_link}.jpg").unlink()
    (root / f"{in_link}.jpg").symlink_to(root / f"{ids[0]}.jpg")                        # inside the root
    extra = sorted(p.stem for p in search_setup["images"].glob("99*.jpg"))[0]
    shutil.copyfile(search_setup["images"] / f"{extra}.jpg", root / f"{extra}.jpg")
    return {"root": root, "ids": ids, "out_link": out_link, "in_link": in_link, "not_indexed": extra}


@pytest.fixture(scope="module")
def server(search_setup, image_root, tmp_path_factory):
    """`mmsparse serve PISA --dense-index FAISS --image-root ROOT --port P` on 127.0.0.1; yields
    the base URL; stopped (SIGTERM, then SIGKILL) afterwards."""
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "serve.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "mmsparse.cli", "serve", str(search_setup["pisa"]),
                                 "--dense-index", str(search_setup["faiss"]), "--image-root", str(image_root["root"]),
                                 "--port", str(port)], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mmsparse serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mmsparse serve did not answer within 120 s: {log.read_text()[-2000:]}")
            time.sleep(0.25)
        yield {"url": url, "log": log, "proc": proc}
    finally:
        _stop(proc)


def test_json_api_answers_what_query_answers(server, search_setup, run_cli):
    url = server["url"]
    info = httpx.get(url + "/info", timeout=10).json()
    assert info["modes"] == ["sparse", "dense"] and info["images"] is True
    assert info["indexes"]["sparse"]["kind"] == "pisa" and info["indexes"]["sparse"]["method"] == "d2s"
    assert info["indexes"]["dense"]["documents"] == 100
    assert info["indexes"]["sparse"]["query_encoder"].endswith("+ d2s head") and info["indexes"]["sparse"]["model_loaded"]
    # the server encodes one text at a time with one thread: the same settings here
    same = ("--k", "10", "--json", "--threads", "1", "--batch-size", "1")
    code, out, err = run_cli("query", search_setup["pisa"], *QUERIES[:3], *same)
    assert code == 0, err
    code, dout, err = run_cli("query", search_setup["faiss"], *QUERIES[:3], *same)
    assert code == 0, err
    for cli, dense_cli in zip(json.loads(out), json.loads(dout)):
        r = httpx.get(url + "/search", params={"q": cli["query"], "k": 10}, timeout=30).json()
        assert r["mode"] == "sparse" and r["index"] == "pisa" and r["k"] == 10
        assert [x["id"] for x in r["results"]] == [x["id"] for x in cli["results"]]
        # PISA's scores from the same quantised index; the query weights differ in the last float bits
        # (the head runs over one text here, three there)
        assert [x["score"] for x in r["results"]] == pytest.approx([x["score"] for x in cli["results"]], rel=1e-6)
        # the same terms with the same weights; the order of near-equal tail weights may swap
        served, cli_terms = ({t["term"]: t["weight"] for t in x["terms"]} for x in (r, cli))
        assert served.keys() == cli_terms.keys() and len(served) == len(r["terms"])
        assert [served[t] for t in cli_terms] == pytest.approx(list(cli_terms.values()), rel=1e-5, abs=1e-6)
        assert all(a["weight"] >= b["weight"] for a, b in zip(r["terms"], r["terms"][1:]))
        # q_t x d_t as floats (the head runs over one text here, three there: last-bit differences)
        assert r["results"][0]["shared"][0]["contribution"] == pytest.approx(
            cli["results"][0]["shared"][0]["contribution"], rel=1e-6)
        assert r["results"][0]["image"] == "/image/" + quote(r["results"][0]["id"])
        d = httpx.get(url + "/search", params={"q": cli["query"], "k": 10, "mode": "dense"}, timeout=30).json()
        assert [x["id"] for x in d["results"]] == [x["id"] for x in dense_cli["results"]]
        assert d["terms"] == [] and d["index"] == "faiss"
    # the OpenAPI page documents the API
    spec = httpx.get(url + "/openapi.json", timeout=10).json()
    params = {p["name"]: p for p in spec["paths"]["/search"]["get"]["parameters"]}
    assert {"q", "k", "mode", "exclude", "add"} <= set(params) and params["k"]["schema"]["maximum"] == 100
    assert "/image/{image_id}" in spec["paths"] and "SearchResponse" in spec["components"]["schemas"]
    assert "swagger" in httpx.get(url + "/docs", timeout=10).text.lower()


def test_limits_and_errors_are_json(server):
    url = server["url"]
    cases = [({"q": "dog", "k": 0}, 422, "k"), ({"q": "dog", "k": 101}, 422, "k"), ({"q": ""}, 422, "q"),
             ({"q": "x" * 301}, 422, "q"), ({"q": "dog", "mode": "hybrid"}, 422, "mode"),
             ({"q": "   "}, 422, "blank"), ({"q": "dog", "add": "ǂǂǂ"}, 400, "vocabulary"),
             ({"q": "dog", "exclude": ["x"] * 65}, 422, "at most")]
    for params, status, word in cases:
        r = httpx.get(url + "/search", params=params, timeout=30)
        body = r.json()
        assert r.status_code == status and body["status"] == status and word in body["error"], (params, body)
    r = httpx.get(url + "/no-such-route", timeout=10)
    assert r.status_code == 404 and r.json() == {"error": "Not Found", "status": 404}
    assert r.headers["x-content-type-options"] == "nosniff"
    page = httpx.get(url + "/", timeout=10)
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]


def _raw_get(url: str, path: str) -> int:
    """Status of GET `path` sent byte for byte (no client-side normalisation of `..`)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_images_only_from_the_image_root(server, image_root, search_setup):
    url, root = server["url"], image_root["root"]
    first = image_root["ids"][0]
    r = httpx.get(f"{url}/image/{first}", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
    assert r.content == (root / f"{first}.jpg").read_bytes()
    assert httpx.get(f"{url}/image/{image_root['in_link']}", timeout=10).status_code == 200   # symlink inside
    refused = ["/image/../../../../etc/passwd", "/image/..%2F..%2F..%2Fetc%2Fpasswd", "/image/%2Fetc%2Fpasswd",
               "/image//etc/passwd", f"/image/{quote(str(search_setup['images'] / first))}",
               f"/image/%2E%2E/{root.name}/{first}", f"/image/{image_root['out_link']}",            # symlink out
               f"/image/{image_root['not_indexed']}", "/image/", "/image/%00"]
    for path in refused:
        assert _raw_get(url, path) == 404, path
        r = httpx.get(url + path, timeout=10)
        assert r.status_code == 404 and r.json()["status"] == 404, path
    # the same rules without HTTP in between
    assert safe_image_path(root, first) == (root / f"{first}.jpg").resolve()
    assert safe_image_path(root, image_root["out_link"]) is None
    assert safe_image_path(root, f"../{root.name}/{first}") is None
    assert safe_image_path(root, image_root["not_indexed"], known_ids=set(image_root["ids"])) is None


@pytest.mark.slow  # 1,000 requests: ~40 s
def test_load_1000_requests_at_concurrency_8(server, capsys):
    """1,000 GET /search on loopback, 8 in flight: 6 texts x k in {10, 20} x none or one dropped
    term (the page's use), so most requests hit the encoded-query cache and the first of each
    text encodes. No request may fail; p50 / p99 are printed."""
    url = server["url"]
    base = httpx.get(url + "/search", params={"q": QUERIES[0], "k": 10}, timeout=30).json()
    drops = [t["term"] for t in base["terms"][:4]]
    lat, errors, lock = [], [], threading.Lock()
    local = threading.local()

    def one(i: int) -> None:
        client = getattr(local, "c", None) or httpx.Client(base_url=url, timeout=30)
        local.c = client
        params = {"q": QUERIES[i % len(QUERIES)], "k": 10 if i % 3 else 20}
        if i % 4 == 1:
            params["exclude"] = drops[i % len(drops)]
        t0 = time.perf_counter()
        try:
            r = client.get("/search", params=params)
            ok = r.status_code == 200 and len(r.json()["results"]) == params["k"]
            msg = None if ok else f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as e:
            msg = repr(e)
        with lock:
            lat.append(time.perf_counter() - t0)
            if msg:
                errors.append(msg)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(one, i) for i in range(1000)]
        done, pending = wait(futures, timeout=300)
        for f in pending:
            f.cancel()
    wall = time.perf_counter() - t0
    assert not pending, f"{len(pending)} requests still pending after 300 s"
    for f in done:
        f.result()
    assert not errors, errors[:5]
    assert len(lat) == 1000
    q = statistics.quantiles(sorted(lat), n=100)
    p50, p99 = statistics.median(lat) * 1000, q[98] * 1000
    with capsys.disabled():
        print(f"\nload test: 1000 requests, concurrency 8, {wall:.1f} s ({1000 / wall:.0f} req/s), "
              f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(lat) * 1000:.1f} ms, {os.cpu_count()} CPUs")
    assert server["proc"].poll() is None


# -- the page in headless Chromium, driven over the Chrome DevTools protocol -------------------

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--window-size=1400,1100", "--remote-debugging-port=0"]


class _DevTools:
    """A minimal Chrome DevTools protocol client over one websocket (flat sessions)."""

    def __init__(self, ws_url: str):
        from websockets.sync.client import connect

        # entered as a context manager (websockets >= 17.1 warns otherwise); close() closes it
        self.ws = connect(ws_url, max_size=None, open_timeout=20).__enter__()
        self.n = 0

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30):
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            m = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if m.get("id") == self.n:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})

    def close(self) -> None:
        self.ws.close()


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium); the page test "
                    "needs a headless browser")
def test_page_query_then_drop_a_term_in_chromium(server, image_root, tmp_path, capsys):
    profile = tmp_path / "profile"
    profile.mkdir()
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: [lines.append(ln) for ln in proc.stderr], daemon=True)
    reader.start()
    cdp = None
    try:
        deadline = time.monotonic() + 60
        while not any("DevTools listening on" in ln for ln in lines):
            assert proc.poll() is None, f"chromium exited: {''.join(lines)[-2000:]}"
            assert time.monotonic() < deadline, f"chromium gave no DevTools endpoint: {''.join(lines)[-2000:]}"
            time.sleep(0.1)
        ws_url = next(ln for ln in lines if "DevTools listening on" in ln).split("listening on", 1)[1].strip()
        cdp = _DevTools(ws_url)
        target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

        def js(expr: str):
            r = cdp.call("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True}, sid)
            if "exceptionDetails" in r:
                raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
            return r["result"].get("value")

        def until(expr: str, what: str, timeout: float = 60):
            """Poll the JS expression until it is true (errors while the page loads count as false)."""
            end = time.monotonic() + timeout
            status = "(document.getElementById('status') || {}).textContent"
            while True:
                try:
                    if js(expr):
                        return
                except RuntimeError:
                    pass
                assert time.monotonic() < end, f"page: {what} did not happen within {timeout} s ({js(status)})"
                time.sleep(0.1)

        def shot(name: str) -> Path:
            png = base64.b64decode(cdp.call("Page.captureScreenshot", {"format": "png"}, sid)["data"])
            (tmp_path / name).write_bytes(png)
            return tmp_path / name

        def click(element: str) -> None:
            """A left click at the centre of the element the JS expression `element` finds."""
            box = js(f"(() => {{ const r = ({element}).getBoundingClientRect(); "
                     "return [r.x + r.width / 2, r.y + r.height / 2]; })()")
            for kind in ("mousePressed", "mouseReleased"):
                cdp.call("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                      "clickCount": 1}, sid)

        hits = "[...document.querySelectorAll('#sparse-results .hit')].map(e => e.dataset.id)"
        chips = "[...document.querySelectorAll('#chips .chip:not(.dropped)')].map(e => e.dataset.term)"
        # every thumbnail loads, but the one image_root links out of the root: the server refuses it (404)
        refused = json.dumps(image_root["out_link"])
        images_loaded = f"[...document.images].every(i => i.complete && (i.naturalWidth > 0 || i.alt === {refused}))"
        cdp.call("Page.enable", session=sid)
        cdp.call("Page.navigate", {"url": server["url"] + "/"}, sid)
        until("document.getElementById('info').textContent.includes('images')", "the /info line")
        assert "query encoder: backbone hf-dual" in js("document.getElementById('info').textContent")
        # type the query into the box and press Enter, as a person does
        js("document.getElementById('q').focus()")
        cdp.call("Input.insertText", {"text": QUERIES[0]}, sid)
        for kind in ("keyDown", "keyUp"):
            cdp.call("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                "windowsVirtualKeyCode": 13, **({"text": "\r"} if kind == "keyDown"
                                                                                else {})}, sid)
        until("document.getElementById('status').dataset.state === 'done' && "
              "document.querySelectorAll('#dense-results .hit').length === 20", "the first search")
        until(images_loaded, "the thumbnails")
        first, terms = js(hits), js(chips)
        assert len(first) == 20 and len(terms) > 3
        assert js("document.querySelector('#sparse-results .hit .terms span') !== null")   # shared terms shown
        after_query = shot("after-query.png")
        # drop the strongest query term with its chip's × and wait for the new results
        top = terms[0]
        t = json.dumps(top)
        click(f"[...document.querySelectorAll('#chips .chip')].find(e => e.dataset.term === {t}).querySelector('.x')")
        until(f"[...document.querySelectorAll('#chips .chip.dropped')].some(e => e.dataset.dropped === {t}) && "
              "document.getElementById('status').dataset.state === 'done'", "the search without the term")
        until(images_loaded, "the new thumbnails")
        second, terms2 = js(hits), js(chips)
        after_drop = shot("after-removing-a-term.png")
        assert top not in terms2 and set(terms2) <= set(terms)
        assert second != first, "dropping the strongest term should change the ranking"
        # the page marks what moved: images new to the results or up / down since the last search
        moved = js("[...document.querySelectorAll('#sparse-results .move')].map(e => e.className)")
        assert moved and all(c.split()[1] in ("new", "up", "down") for c in moved)
        assert f"exclude={quote(top)}" in js("location.search")
        assert after_query.stat().st_size > 20_000 and after_drop.stat().st_size > 20_000
        with capsys.disabled():
            print(f"\nscreenshots: {after_query} and {after_drop} (dropped {top!r}; "
                  f"{sum(a != b for a, b in zip(first, second))} of 20 ranks changed)")
    finally:
        if cdp is not None:
            cdp.close()
        _stop(proc)
