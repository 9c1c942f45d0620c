"""The registry's web pages, served by `registry serve` at `/`: server-rendered (Jinja2 templates in
registry/templates), with one small script and one stylesheet from registry/static. Nothing is fetched from another
host: users run this offline and behind firewalls.

Pages: `/` (models, sortable and filterable; the embedding map as SVG), `/ui/models/NAME` (per category, versions with
a diff between any two, nearest models, fallback chain, availability), `/ui/route` (the route box), `/ui/portfolio`,
`/ui/fingerprint` (upload a results file). Writes from a page go to the HTTP API with the token typed into the page.

What the home page needs is kept per registry state (`_cached`): at a thousand models the page must render in at
most 200 ms, and a t-SNE of the map alone takes seconds, so it is computed once per set of versions.
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from registry.core import dialect
from registry.core.errors import RegistryError
from registry.routing.decision import RouteOptions

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
MAP_LABELS = 60        # models; up to this many, every dot on the map carries its name (more would overlap to noise)
MAP_TSNE_MAX = 100     # models; above it the page's map is a PCA (`registry map` still draws t-SNE there): a t-SNE
#                        of 300 takes seconds of both cores, redrawn as models join
_cache_lock = threading.Lock()   # (the values are kept in the Store's cache: `_cached`)


_KEYS = {   # what each cached value depends on
    "models": """SELECT (SELECT coalesce(max(id), 0) FROM embedding_versions),
        (SELECT coalesce(max(batch_id), 0) FROM evaluations), (SELECT coalesce(max(id), 0) FROM model_availability),
        (SELECT {h:id, name, family, provider, params_b, cost, open_weights, tags::VARCHAR}
         FROM models), (SELECT coalesce(max(id), 0) FROM encoder_activations)""",
    "map": """SELECT (SELECT coalesce(max(id), 0) FROM embedding_versions),
        (SELECT {h:id, family} FROM models),
        (SELECT coalesce(max(id), 0) FROM encoder_activations)""",
}


def _key(reg, what: str) -> tuple:
    """What the value `what` depends on, as it is now (_KEYS)."""
    with reg.store.tx() as tx:
        sql = re.sub(r"\{h:([^}]*)\}", lambda m: dialect.xor_hash(tx.dialect, m.group(1)), _KEYS[what])
        if tx.postgres:   # other processes commit too, not in id order: the counts as well as the newest ids
            sql += (", (SELECT count(*) FROM embedding_versions), (SELECT count(*) FROM import_batches),"
                    " (SELECT count(*) FROM model_availability)")
        return (what,) + tuple(tx.sql(sql)[0])


def _cached(reg, what: str, build, *, depends: str | None = None):
    """A value derived from the registry, kept in its Store's cache until what it depends on (`_KEYS[depends or
    what]`) changes (only the newest: a server that registers all day keeps one of each)."""
    key = _key(reg, depends or what)
    kept = reg.store.section("web pages")
    with _cache_lock:
        if what in kept and kept[what][0] == key:
            return kept[what][1]
    value = build()
    with _cache_lock:
        kept[what] = (key, value)
    return value


CLOSE_WAIT = 10.0       # seconds a stopping server waits for a map's reads (at ten thousand models: ~1 s)


class MapDrawer:
    """The home page's map, drawn off the request (one per app): a t-SNE of a few hundred models takes seconds, so
    while the registry changes a page shows the newest map drawn, saying so, and the next is drawn in the background,
    one drawing at a time, and none sooner after the last than twice its time (under a stream of registrations the
    drawing would otherwise take a core from every other request). Only a page with no map drawn yet waits for one."""
    WAIT = 0.3          # seconds a page waits for a drawing under way before showing the map it has

    def __init__(self):
        self.key: tuple | None = None
        self.value: dict | None = None
        self.drawing: threading.Thread | None = None
        self.rest_until = 0.0       # (monotonic) no new drawing before
        self.closed = False         # the server is stopping: no new drawing, no new read
        self.lock = threading.Lock()
        self.reading = threading.Lock()     # held while a drawing reads the registry

    def draw(self, reg) -> None:
        """Draw the registry's map now, in this thread (a server's warm-up: at ten thousand models its first home
        page would otherwise wait seconds for the map, and drawn beside the first requests, it slowed them)."""
        self._draw(reg, None)

    def close(self, timeout: float = CLOSE_WAIT) -> None:
        """No drawing from now on; the reads of one under way are waited for, up to `timeout` (they must end before
        the registry's connection closes: DuckDB refuses to close a connection a query is running on)."""
        with self.lock:
            self.closed = True
        if self.reading.acquire(timeout=timeout):
            self.reading.release()

    def get(self, reg) -> tuple[dict, bool]:
        """(the map, whether it is the registry's map now)."""
        key = _key(reg, "map")
        with self.lock:
            if key == self.key and self.value is not None:
                return self.value, True
            idle = self.drawing is None or not self.drawing.is_alive()
            if self.value is not None and (not idle or time.monotonic() < self.rest_until):
                return self.value, False
            if idle and not self.closed:
                self.drawing = threading.Thread(target=self._draw, args=(reg, key), name="map drawing", daemon=True)
                self.drawing.start()
            drawing, first = self.drawing, self.value is None
        if drawing is not None:
            drawing.join(timeout=None if first else self.WAIT)
        with self.lock:
            return self.value or {"points": [], "families": [], "method": None}, self.key == key

    def _draw(self, reg, key: tuple | None) -> None:
        started = time.monotonic()
        try:
            with self.reading:
                if self.closed:
                    return
                key = key or _key(reg, "map")
                read = _map_reads(reg)
            value = _map(*read)
        except Exception:           # (a page then shows the map it has; the next page tries again)
            return
        with self.lock:
            self.key, self.value = key, value
            self.rest_until = time.monotonic() + 2 * (time.monotonic() - started)


def _map_reads(reg) -> tuple:
    """What the map is drawn from: (the pool, or None where nothing is embedded; each model's family)."""
    with reg.store.tx() as tx:
        try:
            p = reg.pool(tx)
        except RegistryError:
            return None, {}
        return p, dict(tx.sql("SELECT name, family FROM models"))


def _map(p, families: dict) -> dict:
    """The embedding map as SVG-ready points: {name, x, y, colour, family, label} in a 0..1000 x 0..600 box."""
    from registry.answers import maps

    if p is None:
        return {"points": [], "families": [], "method": None}
    if len(p.names) > MAP_TSNE_MAX:    # t-SNE of 1,000 points takes half a minute: a page cannot wait for it
        xy, method = maps.principal_axes(p.vectors), "pca"
    else:
        xy, method = maps.project(p.vectors, 0)
    lo, hi = xy.min(axis=0), xy.max(axis=0)
    span = (hi - lo) + 1e-9
    fam = [families.get(n) or "(unknown)" for n in p.names]
    colours = maps.family_colours(fam)
    pts = [{"name": n, "x": round(20 + 960 * (x - lo[0]) / span[0], 1), "y": round(20 + 560 * (y - lo[1]) / span[1], 1),
            "colour": colours[f], "family": f} for n, (x, y), f in zip(p.names, xy, fam)]
    pts = maps.place_labels(pts) if len(pts) <= MAP_LABELS else pts      # labels that never overlap (or none)
    return {"points": pts, "families": sorted(colours.items()), "method": method}


def page(request: Request, name: str, **context) -> HTMLResponse:
    return templates.TemplateResponse(request, name, {"needs_token": _needs_token(request), **context})


def error_page(request: Request, message: str, status: int = 404) -> HTMLResponse:
    """A page that says what went wrong (the server's handlers answer a page's bad parameters with one too)."""
    return templates.TemplateResponse(request, "error.html", {"message": message,
                                                              "needs_token": _needs_token(request)},
                                      status_code=status)


def _needs_token(request: Request) -> bool:
    return request.app.state.server.token is not None


pages = APIRouter(include_in_schema=False)


def mount(app: FastAPI, drawer: MapDrawer | None = None) -> None:
    """The pages' static files, and HTTP errors under /ui/ answered as pages (the app adds the `pages` themselves);
    `drawer`: the home page's map, where the app's maker holds it (a server's warm-up draws the first)."""
    app.mount("/static/web", StaticFiles(directory=str(HERE / "static")), name="web")
    app.state.map_drawer = drawer or MapDrawer()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if request.url.path.startswith("/ui/"):
            return error_page(request, "no such page" if exc.status_code == 404 else str(exc.detail), exc.status_code)
        return await http_exception_handler(request, exc)



def _registry(request: Request):
    return request.app.state.server.registry


@pages.get("/", response_class=HTMLResponse)
def home(request: Request, offset: Annotated[int, Query(ge=0)] = 0):
    """The map and a page of the models (MODEL_PAGE of them from `offset`: only their evaluations are read)."""
    from registry.answers.catalog import MODEL_PAGE

    reg = _registry(request)
    models_ = _cached(reg, f"models {MODEL_PAGE} from {offset}", lambda: reg.models(limit=MODEL_PAGE, offset=offset),
                      depends="models")
    total = _cached(reg, "model count", reg.model_count, depends="models")
    the_map, current = request.app.state.map_drawer.get(reg)
    return page(request, "home.html", models=models_, total=total, offset=offset, page_size=MODEL_PAGE,
                map=the_map, map_current=current, path=reg.path, map_labels=MAP_LABELS)


@pages.get("/ui/models/{name:path}/diff", response_class=HTMLResponse)
def diff_page(request: Request, name: str, v1: int | None = None, v2: int | None = None):
    try:
        d = _registry(request).diff(name, v1, v2)
    except RegistryError as exc:
        return error_page(request, str(exc), 400)
    return page(request, "diff.html", d=d)


@pages.get("/ui/models/{name:path}", response_class=HTMLResponse)
def model_page(request: Request, name: str):
    reg = _registry(request)
    try:
        detail = reg.show(name)
        history = reg.history(name)
    except RegistryError as exc:
        return error_page(request, str(exc))
    from registry.answers import neighbours

    near, chain, note, near_notes, chain_by = [], [], None, [], ""
    if detail.version is not None:
        try:
            near = request.app.state.server.serving.similar(name, k=8)    # (what GET /models/X/similar answers)
            near_notes = neighbours.similar_notes(near, 8, name, detail.embedded_from, reg.probation_min)
            fb = reg.fallback(name, k=5)
            chain, chain_by = fb.chain, fb.ranked_by
        except RegistryError as exc:
            note = str(exc)
    # each list says what it ranks by (`similar` by shared answers, the fallback chain by the embedding alone)
    return page(request, "model.html", m=detail, history=history, near=near, chain=chain, note=note,
                near_notes=near_notes, near_by=neighbours.RANKED_BY_ANSWERS, chain_by=chain_by)


@pages.get("/ui/route", response_class=HTMLResponse)
def route_page(request: Request, q: str | None = None):
    decision, error = None, None
    if q:
        try:
            decision = _registry(request).route(q, RouteOptions(log=False))
        except RegistryError as exc:
            error = str(exc)
    return page(request, "route.html", q=q or "", d=decision, error=error)


@pages.get("/ui/portfolio", response_class=HTMLResponse)
def portfolio_page(request: Request, k: int | None = Query(None, ge=1, le=1000), method: str | None = None):
    from registry.answers import portfolio

    k = portfolio.DEFAULT_K if k is None else k       # the CLI's and HTTP's default size
    result, error = None, None
    try:
        # what `registry portfolio` and GET /portfolio answer, its routing accuracy (as served) among them
        result = _registry(request).portfolio(k, method)
    except RegistryError as exc:
        error = str(exc)
    shown = result.method if result else method or portfolio.DEFAULT_METHOD
    return page(request, "portfolio.html", p=result, k=k, method=shown, methods=portfolio.METHODS, error=error)


@pages.get("/favicon.ico")
def favicon():
    """The icon browsers ask for whatever the page says (the pages name /static/web/favicon.svg)."""
    from fastapi.responses import FileResponse

    return FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml")


@pages.get("/ui/fingerprint", response_class=HTMLResponse)
def fingerprint_page(request: Request):
    return page(request, "fingerprint.html")


@pages.get("/ui/endpoints/{name:path}", response_class=HTMLResponse)
def endpoints_page(request: Request, name: str):
    """The endpoints claiming a model, each one's watch timeline: accuracy and disagreement per round with their
    intervals, the sequential test, verdict changes."""
    reg = _registry(request)
    try:
        reg.show(name)
        status = reg.watch(status=True, models=[name])
        now = reg.endpoint_verdicts(name) if status.claims else {}
    except RegistryError as exc:
        return error_page(request, str(exc))
    by: dict = {}
    for r in status.rounds:
        by.setdefault(r.endpoint, []).append(r)
    return page(request, "endpoints.html", model=name, claims=status.claims, rounds=by, events=status.events,
                now=now)
