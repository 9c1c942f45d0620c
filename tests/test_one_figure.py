"""One quantity, one figure: each figure read from the CLI's --json, from HTTP and from the web page (the number
parsed out of the HTML) is the same, on a copy of a registry with splits. The quantities a user found shown two ways:
a portfolio's routing accuracy, a model's evaluations (all of its results) and the evaluations behind its embedding
(`embedded_from`), the interaction's val hit@1 in `evaluate`'s two lines, the encoder's figure at training against
today's, and what `similar`, a fallback chain and a version diff rank by."""
from __future__ import annotations

import re
import shutil
from html.parser import HTMLParser

import duckdb
import pytest
from fastapi.testclient import TestClient

from registry import Registry
from registry.serve.app import create_app

from .helpers import run, run_json

pytestmark = pytest.mark.slow      # an app's warm-up, a routing refit and `evaluate`: seconds

GPT = "gpt-4o-2024-05-13"


class _Page(HTMLParser):
    """The texts of an HTML page: every table's rows of cells and every list's items (by the element's id), and
    the text of every element with an id."""

    def __init__(self, html: str):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.lists: dict[str, list[str]] = {}
        self.by_id: dict[str, str] = {}
        self._open: list[tuple[str, str | None]] = []       # (tag, id) of the open elements
        self._texts: dict[str, list[str]] = {}             # id -> text so far, while open
        self._cell: list[str] | None = None
        self._table: str | None = None
        self._list: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag in ("br", "input", "img", "meta", "link"):
            return
        ident = dict(attrs).get("id")
        self._open.append((tag, ident))
        if ident:
            self._texts[ident] = []
        if tag == "table" and ident:
            self._table = ident
            self.tables[ident] = []
        elif tag in ("ol", "ul") and ident:
            self._list = ident
            self.lists[ident] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "li"):
            self._cell = []

    def handle_endtag(self, tag):
        while self._open:
            t, ident = self._open.pop()
            if ident:
                self.by_id[ident] = " ".join("".join(self._texts.pop(ident)).split())
            if t == tag:
                break
        text = None if self._cell is None else " ".join("".join(self._cell).split())
        if tag == "td" and self._table is not None and self.tables[self._table]:
            self.tables[self._table][-1].append(text or "")
            self._cell = None
        elif tag == "li" and self._list is not None:
            self.lists[self._list].append(text or "")
            self._cell = None
        elif tag == "table":
            self._table = None
        elif tag in ("ol", "ul"):
            self._list = None

    def handle_data(self, data):
        for part in self._texts.values():
            part.append(data)
        if self._cell is not None:
            self._cell.append(data)


def _rows(page: _Page, table: str) -> list[list[str]]:
    return [r for r in page.tables[table] if r]         # (the header row has no td)


@pytest.fixture(scope="module")
def served(base_db, small_data, tmp_path_factory):
    """A copy of the session's registry in which GPT's nearest model has a second version (a diff to read), its
    CLI figures read first, then the app serving it (its HTTP answers and pages)."""
    db = tmp_path_factory.mktemp("one_figure") / "registry.duckdb"
    shutil.copy(base_db, db)
    with Registry(db) as reg:
        neighbour = reg.similar(GPT, k=1)[0].model
        rows = duckdb.sql(f"""SELECT question_id, 1 - correct FROM read_csv('{small_data}/evaluations.csv.gz')
                              WHERE model = '{neighbour}' ORDER BY question_id LIMIT 40""").fetchall()
        f = db.parent / "more.csv"
        f.write_text("question_id,correct\n" + "".join(f"{q},{c}\n" for q, c in rows))
        reg.register(neighbour, str(f), update=True)
        with reg.store.tx() as tx:          # a question the registry holds: routed without MiniLM
            question = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
    with TestClient(create_app(str(db))) as client:
        yield db, client, neighbour, question


def test_portfolio_routing_accuracy_is_one_figure(served):
    db, c, _, _ = served
    cli = run_json(db, "portfolio")
    http = c.get("/portfolio").json()
    page = _Page(c.get("/ui/portfolio").text)
    share = re.search(r"routing accuracy ([0-9.]+) on test .*?([0-9.]+)% of the whole pool's ([0-9.]+)",
                      page.by_id["share"])
    assert share, page.by_id["share"]
    assert cli["accuracy"] is not None and cli["pool_accuracy"] is not None      # without --target too
    for key in ("models", "accuracy", "pool_accuracy", "share_of_pool"):
        assert cli[key] == http[key], key
    assert [r[0] for r in _rows(page, "members")] == cli["models"]
    assert (float(share[1]), float(share[3])) == (cli["accuracy"], cli["pool_accuracy"])
    assert float(share[2]) == round(cli["share_of_pool"] * 100, 1)
    text = run(db, "portfolio").output
    assert f"routing accuracy {cli['accuracy']:.4f} on test" in text and f"pool's {cli['pool_accuracy']:.4f}" in text
    # the pool's is routing as served: `evaluate`'s row `served`
    assert cli["pool_accuracy"] == run_json(db, "evaluate", "--no-baselines")["methods"]["served"]["hit@1"]


def test_evaluations_and_embedded_from_are_two_figures_each_under_its_own_name(served):
    db, c, _, question = served
    listed = {m["name"]: m for m in run_json(db, "models")}
    over_http = {m["name"]: m for m in c.get("/models").json()}
    home = {r[0].split(" (another name")[0]: r for r in _rows(_Page(c.get("/").text), "models")}
    assert set(listed) == set(over_http) == set(home)
    for name, m in listed.items():
        assert m["evaluations"] == over_http[name]["evaluations"] == int(home[name][5]), name
        assert m["embedded_from"] == over_http[name]["embedded_from"], name
    shown = run_json(db, "show", GPT)
    model_page = c.get(f"/ui/models/{GPT}").text
    assert shown["evaluations"] == c.get(f"/models/{GPT}").json()["evaluations"] == listed[GPT]["evaluations"]
    assert re.search(r"· (\d+) evaluations", model_page)[1] == str(shown["evaluations"])
    assert re.search(r"embedded from (\d+) evaluations", model_page)[1] == str(shown["embedded_from"])
    assert shown["embedded_from"] < shown["evaluations"]        # the test answers are held out: two quantities
    # route names the evaluations behind the embedding embedded_from, as models and show do
    cli = {x["model"]: x for x in run_json(db, "route", question, "--no-log")["candidates"]}
    http = {x["model"]: x for x in c.post("/route", json={"text": question}).json()["candidates"]}
    page = _Page(c.get("/ui/route", params={"q": question}).text)
    cells = {r[0]: r for r in _rows(page, "candidates")}
    assert "evaluations" not in next(iter(cli.values()))
    assert set(cli) == set(http) == set(cells) == set(listed)
    for name in cli:
        assert cli[name]["embedded_from"] == http[name]["embedded_from"] == int(cells[name][5]) \
            == listed[name]["embedded_from"], name
    assert "embedded from" in run(db, "route", question, "--no-log").output


def test_the_interaction_val_hit_is_one_figure_and_the_encoders_is_at_training(served):
    db, _, _, _ = served
    r = run_json(db, "evaluate", "--no-baselines")
    chosen, predictor = r["interaction"]["val_hit"]["chosen"], r["interaction"]["val_hit"]["predictor"]
    assert round(chosen, 4) == r["served"]["val_hit"]["locus_interaction"]
    text = run(db, "evaluate", "--no-baselines").output
    line = next(ln for ln in text.splitlines() if ln.startswith("routing (locus_interaction)"))
    policy = next(ln for ln in text.splitlines() if ln.startswith("served policy"))
    assert f"val hit@1 {chosen:.4f}" in line and f"locus_interaction {chosen:.4f}" in policy
    assert f"the predictor alone {predictor:.4f}; today's" in line
    # the encoder's own figure is the one its training recorded, said so beside it
    enc = run_json(db, "encoders")[0]
    split = enc["hit1_at_training_split"]
    assert split in ("test", "val") and enc["hit1_at_training"] == round(enc["metrics"][f"{split}_hit@1"], 4)
    listing = run(db, "encoders").output
    assert "hit@1 at training" in listing and f"{enc['hit1_at_training']:.4f} ({split})" in listing


def test_similar_fallback_and_diff_say_what_they_rank_by(served):
    db, c, neighbour, _ = served
    near = run_json(db, "similar", GPT, "-k", 8)
    chain = run_json(db, "fallback", GPT)
    page = _Page(c.get(f"/ui/models/{GPT}").text)
    assert near["ranked_by"] != chain["ranked_by"]                 # two rules, each said with its list
    # similar: the CLI, HTTP and the model page, one order by one rule, said on each
    http_near = c.get(f"/models/{GPT}/similar", params={"k": 8}).json()
    rows = _rows(page, "neighbours")
    assert [x["model"] for x in near["neighbours"]] == [x["model"] for x in http_near] == [r[0] for r in rows]
    assert [x["combined"] for x in near["neighbours"]] == [x["combined"] for x in http_near] \
        == [float(r[6]) for r in rows]
    assert page.by_id["neighbours-ranked-by"] == f"ranked by {near['ranked_by']}"
    assert f"ranked by: {near['ranked_by']}" in run(db, "similar", GPT).output
    # the fallback chain: by the embedding alone, on every one of them
    http_chain = c.get(f"/models/{GPT}/fallback").json()
    assert [x["model"] for x in chain["chain"]] == [x["model"] for x in http_chain["chain"]] \
        == [li.split()[0] for li in page.lists["fallback"]]
    assert chain["ranked_by"] == http_chain["ranked_by"]
    assert page.by_id["fallback-ranked-by"] == f"ranked by {chain['ranked_by']}"
    assert f"ranked by: {chain['ranked_by']}" in run(db, "fallback", GPT).output
    # a version diff: its neighbours by the embedding alone too, on the CLI and its page
    d = run_json(db, "diff", neighbour)
    diff_page = _Page(c.get(f"/ui/models/{neighbour}/diff").text)
    assert d["ranked_by"] == chain["ranked_by"] and diff_page.by_id["ranked-by"] == f"nearest models ranked by " \
        f"{d['ranked_by']}"
    assert f"nearest ranked by: {d['ranked_by']}" in run(db, "diff", neighbour).output
    assert [n["model"] for n in d["neighbours_v2"]] == [li.split()[0] for li in diff_page.lists["nearest-v2"]]


def test_the_servers_count_of_evaluations_is_the_tables(db_copy, small_data):
    """GET /stats takes the count of current evaluations from the server's answer book where the book has read every
    commit; it is the figure the library counts from the table, after a registration, an update that supersedes
    answers, and a deletion (and the book's count is what answered: a book that counted wrong would show)."""
    from registry.answers import catalog

    gpt = run_json(db_copy, "show", GPT)["evaluations"]
    auth = {"Authorization": "Bearer t0ken"}
    rows = [{"question_id": q, "correct": int(c)} for q, c in duckdb.sql(
        f"""SELECT question_id::VARCHAR, correct FROM read_csv('{small_data}/evaluations.csv.gz')
            WHERE model = 'gemma-7b' ORDER BY question_id LIMIT 80""").fetchall()]
    with TestClient(create_app(str(db_copy), token="t0ken")) as c:
        figures = []
        for step in ("new", "update", "delete"):
            if step == "new":
                r = c.post("/models", json={"name": "counted", "evaluations": rows[:60]}, headers=auth)
            elif step == "update":      # 20 answers more and 10 of the 60 answered again the other way
                again = [{**x, "correct": 1 - x["correct"]} for x in rows[:10]]
                r = c.post("/models", json={"name": "counted", "evaluations": again + rows[60:], "update": True},
                           headers=auth)
            else:
                r = c.delete(f"/models/{GPT}", headers=auth)
            assert r.status_code == 200, r.text
            book = c.app.state.server.serving.writer.book.current_count()
            with Registry(db_copy) as reg, reg.store.tx() as tx:
                table = catalog.stats(tx, str(db_copy)).evaluations      # counted from the table
                assert book[1:] == tuple(tx.sql("""SELECT (SELECT max(batch_id) FROM evaluations),
                                                          (SELECT coalesce(max(id), 0) FROM model_changes)""")[0])
            figures.append((c.get("/stats").json()["evaluations"], book[0], table))
    assert all(served == book == table for served, book, table in figures), figures
    assert figures[1][0] == figures[0][0] + 20 and figures[2][0] == figures[1][0] - gpt
