"""Lists and the map: case-blind model order, distinct family colours, a map that shows structure, import batch
ids shown as ids, left-out models not listed, the home page's labels and aliases."""
from __future__ import annotations

import numpy as np
from fastapi.testclient import TestClient

from registry import Registry
from registry.serve.app import create_app
from tests.helpers import run, run_json


def test_family_colours_stay_distinct_past_the_palette():
    from registry.answers.maps import PALETTE, family_colours

    families = [f"family-{i}" for i in range(40)]
    colours = family_colours(families)
    assert len(set(colours.values())) == 40                                 # no two families share a colour
    assert len(set(colours.values()) & set(PALETTE)) == len(PALETTE)       # the palette first
    assert family_colours(families) == family_colours(reversed(families))  # the same whatever the order given
    real = ["command-r", "deepseek", "gemini-1.5", "gemma", "gpt-4o", "jamba", "llama-2", "llama-3", "llama-3.1",
            "mistral", "mixtral", "phi-3", "qwen1.5", "yi", "(unknown)", "a-new-family"]
    assert len(set(family_colours(real).values())) == len(real)


def test_the_map_of_a_small_registry_is_a_pca_that_shows_more_than_one_direction(db_copy):
    from scipy.spatial.distance import pdist
    from scipy.stats import pearsonr

    from registry.answers import maps

    with Registry(db_copy) as reg, reg.store.tx() as tx:
        vectors = reg.pool(tx).vectors.astype(np.float64)
    xy, method = maps.project(vectors)
    assert method == "pca" and len(vectors) <= maps.PCA_MAX
    drawn = (xy - xy.min(0)) / np.ptp(xy, axis=0)                 # as the plot shows it, each axis to its range
    eig = np.linalg.eigvalsh(np.cov(drawn.T))
    assert eig.max() / eig.sum() < 0.9                            # not a straight line (t-SNE's: 0.99 on 31 models)
    assert pearsonr(pdist(vectors), pdist(xy))[0] > 0.95           # 2-D distances track the 128-d ones


def rename(db, old: str, new: str) -> None:
    import duckdb

    con = duckdb.connect(str(db))
    con.execute("UPDATE models SET name = ? WHERE name = ?", [new, old])
    con.close()


def test_model_lists_sort_without_regard_to_case(db_copy):
    rename(db_copy, "Yi-6B", "api-model")
    with Registry(db_copy) as reg:
        reg.set_endpoint("api-model", "http://127.0.0.1:9/v1")
        reg.set_endpoint("Yi-34B", "http://127.0.0.1:9/v1")
    names = [m["name"] for m in run_json(db_copy, "models")]
    assert names == sorted(names, key=str.casefold) and names != sorted(names)      # "api-model" before "Yi-34B"
    with Registry(db_copy) as reg:
        assert [a.model for a in reg.availability()] == names
    assert [e["model"] for e in run_json(db_copy, "endpoints")] == ["api-model", "Yi-34B"]
    chains = run_json(db_copy, "fallback", "--all")["chains"]
    assert list(chains) == sorted(chains, key=str.casefold)


def test_show_names_import_batch_ids_as_ids(db_copy):
    out = run(db_copy, "show", "Yi-6B").output
    line = next(ln for ln in out.splitlines() if ln.startswith("evaluations:"))
    assert "import batch ids: 1" in line and "import batches:" not in line


def test_route_by_size_does_not_list_the_models_it_left_out(db_copy):
    import duckdb

    from registry import RouteOptions

    with Registry(db_copy) as reg, reg.store.tx() as tx:
        text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
    with Registry(db_copy) as reg:
        top = [c.model for c in reg.route(text, RouteOptions(log=False)).candidates[:3]]   # the three most likely
    con = duckdb.connect(str(db_copy))
    con.execute(f"UPDATE models SET params_b = NULL WHERE name IN ({', '.join('?' * 3)})", top)
    con.close()
    out = run(db_copy, "route", text, "--cost-by", "params", "--min-prob", "0.8", "--no-log")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    start = next(i for i, ln in enumerate(lines) if "candidate" in ln) + 2
    rows = [ln.split()[1] if ln.startswith("*") else ln.split()[0] for ln in lines[start:start + 5]]
    assert not set(rows) & set(top), rows                                   # left out: not listed as candidates
    named = next(ln for ln in lines if ln.startswith("left out (no parameter count; cost by params_b): "))
    named = named.split(": ", 1)[1].split(", ")
    assert set(top) <= set(named) and f"{len(named)} models without a parameter count left out" in out.output
    d = run_json(db_copy, "route", text, "--cost-by", "params", "--min-prob", "0.8", "--no-log")
    assert {c["model"] for c in d["candidates"] if not c["eligible"]} == set(named)   # the JSON marks them


def test_the_home_page_labels_the_map_and_marks_aliases(db_copy, tmp_path):
    with Registry(db_copy) as reg:
        names = [m.name for m in reg.models()]
        with reg.store.tx() as tx:
            rows = tx.sql("""SELECT q.external_id, e.correct::INT FROM evaluations e JOIN queries q ON q.id = e.query_id
                             JOIN models m ON m.id = e.model_id WHERE m.name = ? ORDER BY q.id""", [names[0]])
        copy = tmp_path / "copy.csv"
        copy.write_text("question_id,correct\n" + "".join(f"{q},{c}\n" for q, c in rows))
        reg.register("second-name", str(copy), alias_of=names[0])
    with TestClient(create_app(str(db_copy))) as c:
        page = c.get("/").text
    assert all(f"<title>{n} (" in page for n in names)                       # every dot carries its name
    drawn = [n for n in names if f'font-size="13">{n}</text>' in page]
    assert len(drawn) >= 0.8 * len(names)                                    # and most a label (none overlapping)
    assert f'(another name of <a href="/ui/models/{names[0]}">{names[0]}</a>)' in page


def test_the_home_page_map_labels_never_overlap(db_copy):
    """Each label drawn is a box (at its own textLength, so the box is what any font draws): no two overlap, none
    covers another model's dot, and a label that found no room is said, its name still in the dot's tooltip."""
    import html
    import re

    from registry.answers import maps

    with TestClient(create_app(str(db_copy))) as c:
        page = c.get("/").text
    dots = {html.unescape(n): (float(x), float(y)) for x, y, n in re.findall(
        r'<circle cx="([\d.]+)" cy="([\d.]+)" r="7" fill="[^"]+"><title>(.+?) \(', page)}
    labels = re.findall(r'<text class="label" x="([\d.]+)" y="([\d.]+)"(?: text-anchor="(\w+)")?'
                        r'(?: textLength="([\d.]+)")?[^>]*>([^<]+)</text>', page)
    assert len(dots) == 31 and len(labels) >= 25
    boxes = {}
    for x, y, anchor, width, name in labels:
        name = html.unescape(name)
        boxes[name] = maps.label_box(float(x), float(y), anchor or "start",
                                     float(width) if width else maps.label_width(name))
    overlaps = [(a, b) for i, a in enumerate(boxes) for b in list(boxes)[i + 1:]
                if maps.boxes_overlap(boxes[a], boxes[b])]
    assert overlaps == []
    covered = [(n, d) for n, box in boxes.items() for d, (x, y) in dots.items()
               if d != n and maps.boxes_overlap(box, (x - 7, y - 7, x + 7, y + 7))]
    assert covered == []
    left = len(dots) - len(boxes)
    assert (f"{left} label" in page) == (left > 0)


def test_label_placement_drops_what_does_not_fit_and_overlaps_nothing():
    from registry.answers import maps

    rng = np.random.default_rng(0)
    points = [{"name": f"Some-Model-Name-{i}-Instruct", "x": float(x), "y": float(y)}
              for i, (x, y) in enumerate(rng.normal([500, 300], [120, 60], size=(40, 2)))]
    placed = maps.place_labels(points)
    assert [p["name"] for p in placed] == [p["name"] for p in points]
    boxes = [maps.label_box(p["label"]["x"], p["label"]["y"], p["label"]["anchor"], p["label"]["width"])
             for p in placed if p["label"]]
    assert 10 <= len(boxes) < len(points)                     # crowded: some labels left to the tooltip
    assert not any(maps.boxes_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert all(0 <= b[0] and b[2] <= 1000 and 0 <= b[1] and b[3] <= 600 for b in boxes)


def test_model_lists_come_in_pages_everywhere(db_copy, monkeypatch):
    """A page of the models (by name) is the same slice in the library, the command line, HTTP and the home page;
    HTTP says the total and the next page, as GitHub's API does."""
    from registry.answers import catalog

    with Registry(db_copy) as reg:
        every = [m.name for m in reg.models()]
        assert [m.name for m in reg.models(limit=5, offset=3)] == every[3:8]
        assert reg.models(limit=5, offset=len(every)) == [] and reg.model_count() == len(every)
    assert [m["name"] for m in run_json(db_copy, "models", "--limit", "5", "--offset", "3")] == every[3:8]
    with TestClient(create_app(str(db_copy))) as c:
        r = c.get("/models", params={"limit": 5, "offset": 3})
        assert [m["name"] for m in r.json()] == every[3:8]
        assert r.headers["x-total-count"] == str(len(every)) and 'offset=8>; rel="next"' in r.headers["link"]
        whole = c.get("/models")                               # a page of MODEL_PAGE unless asked: all 31 here
        assert [m["name"] for m in whole.json()] == every and "link" not in whole.headers
        assert c.get("/models", params={"limit": catalog.MODEL_PAGE_MAX + 1}).status_code == 422
        assert c.get("/models", params={"offset": -1}).status_code == 422
        monkeypatch.setattr(catalog, "MODEL_PAGE", 10)
        page = c.get("/", params={"offset": 10}).text
    assert page.count("<tr data-open=") == 10 and f"11-20 of {len(every)}" in page
    assert 'href="/?offset=20" rel="next"' in page and 'href="/?offset=0" rel="prev"' in page
    assert f">{every[10]}</a>" in page and f">{every[9]}</a></td>" not in page


def test_a_served_registry_draws_its_map_before_the_first_page(db_copy):
    """`registry serve` draws the map in its warm-up (create_app's map_when_ready), so the first home page need not
    wait for a drawing of thousands of models, nor a drawing slow the first requests: drawn by the time the server
    is ready, and the first page shows that map; an app without it draws on the first page, and a stopping app draws
    no more."""
    plain = create_app(str(db_copy))
    with TestClient(plain):
        plain.state.server.serving.wait_ready()
        assert plain.state.map_drawer.value is None and plain.state.map_drawer.drawing is None
    app = create_app(str(db_copy), map_when_ready=True)
    with TestClient(app) as c:
        app.state.server.serving.wait_ready()
        drawer = app.state.map_drawer
        drawn = drawer.value
        assert drawn is not None and len(drawn["points"]) == 31 and drawer.drawing is None
        page = c.get("/").text
        assert drawer.value is drawn                        # (the page took the map drawn before it: no new one)
    assert page.count("<circle ") >= 31
    assert drawer.closed                                    # (shut down: no drawing begins after the registry closes)
