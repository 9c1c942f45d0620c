"""The web pages in a real browser: Debian's Chromium driven by Playwright against a real `registry serve` process on
loopback. Clicks from the home page to a model, to a neighbour, to a version diff; the route box; the portfolio and
fingerprint views; a write without and with the token. Fails if any request leaves the server's origin. Screenshots
of each page go to build/screenshots/ (not committed)."""
from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from registry import Registry

from .conftest import start_server

pytestmark = pytest.mark.slow      # a browser and a server process

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
SHOTS = Path(__file__).resolve().parents[1] / "build" / "screenshots"
TOKEN = "web-secret"
GPT = "gpt-4o-2024-05-13"
BLOCKED: list[str] = []        # what the pages' Content-Security-Policy refused, as the browser's console says


@pytest.fixture(scope="module")
def site(base_db, small_data, tmp_path_factory):
    """A served registry in which GPT's nearest model has two versions (so there is a diff to click to)."""
    if not Path(CHROMIUM).exists():   # fail, not skip: .ci/run installs it
        pytest.fail(f"{CHROMIUM} not found: `apt-get install chromium` (.ci/run does)")
    tmp = tmp_path_factory.mktemp("web")
    db = tmp / "registry.duckdb"
    shutil.copy(base_db, db)
    with Registry(db) as reg:
        neighbour = reg.similar(GPT, k=1)[0].model
        rows = duckdb.sql(f"""SELECT question_id, 1 - correct AS correct
                              FROM read_csv('{small_data}/evaluations.csv.gz')
                              WHERE model = '{neighbour}' ORDER BY question_id LIMIT 40""").fetchall()
        f = tmp / "more.csv"
        f.write_text("question_id,correct\n" + "".join(f"{q},{c}\n" for q, c in rows))
        reg.register(neighbour, str(f), update=True)
        assert len(reg.history(neighbour).versions) == 2
    proc, origin = start_server(db, TOKEN)
    yield origin, neighbour, small_data
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser_page(site):
    from playwright.sync_api import sync_playwright

    origin = site[0]
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1100, "height": 800})
        outside: list[str] = []
        page.on("request", lambda r: None if r.url.startswith(origin + "/") or r.url.startswith("data:")
                else outside.append(r.url))
        page.on("console", lambda m: BLOCKED.append(m.text) if "Content Security Policy" in m.text else None)
        yield page, outside
        browser.close()


def test_home_model_neighbour_and_diff(site, browser_page):
    origin, neighbour, _ = site
    page, outside = browser_page
    page.goto(origin + "/")
    assert page.locator("h1").inner_text() == "31 models"
    assert page.locator("svg#map circle").count() == 31
    page.screenshot(path=str(SHOTS / "home.png"))
    page.fill("#filter", "llama-2")
    visible = [r for r in page.locator("#models tbody tr").all() if r.is_visible()]
    assert len(visible) == 3
    page.fill("#filter", "")
    page.locator("#models th", has_text="accuracy").click()        # sort by accuracy: ascending, then descending
    page.locator("#models th", has_text="accuracy").click()
    first = page.locator("#models tbody tr").first.locator("td").nth(4).inner_text()
    assert float(first) == max(float(t) for t in page.locator("#models tbody tr td:nth-child(5)").all_inner_texts())
    page.click(f"#models a:text-is('{GPT}')")
    assert page.locator("h1").inner_text() == GPT and "Per category" in page.content()
    assert page.locator("#fallback li").count() == 5
    page.screenshot(path=str(SHOTS / "model.png"), full_page=True)
    page.click(f"#neighbours a:text-is('{neighbour}')")
    assert page.locator("h1").inner_text() == neighbour
    assert page.locator("#versions tbody tr").count() == 2
    page.click("#diff-button")
    assert "version 1 → 2" in page.locator("h1").inner_text()
    assert page.locator("#moved").inner_text().startswith("moved")
    page.screenshot(path=str(SHOTS / "diff.png"), full_page=True)
    assert outside == []


def test_route_box_portfolio_and_fingerprint(site, browser_page, tmp_path):
    origin, _, small_data = site
    page, outside = browser_page
    page.goto(origin + "/ui/route")
    page.fill("#question", "Which enzyme unwinds the DNA double helix?")
    page.click("#route-button")
    chosen = page.locator("#chosen b").inner_text()
    assert chosen and page.locator("#candidates tr.chosen").count() == 1
    assert page.locator("#candidates tbody tr").count() == 31 and page.locator("#candidates .bar").count() >= 31
    page.screenshot(path=str(SHOTS / "route.png"), full_page=True)
    page.goto(origin + "/ui/portfolio")
    page.fill("#k", "2")
    page.select_option("#method", "routing")
    page.click("#portfolio-button")
    assert page.locator("#members tbody tr").count() == 2
    assert "% of the whole pool" in page.locator("#share").inner_text()
    page.screenshot(path=str(SHOTS / "portfolio.png"))
    f = tmp_path / "unknown.csv"
    f.write_text("question_id,correct\n" + "".join(
        f"{q},{c}\n" for q, c in duckdb.sql(f"""SELECT question_id, correct::INT FROM
            read_csv('{small_data}/evaluations.csv.gz') WHERE model = '{GPT}'""").fetchall()))
    page.goto(origin + "/ui/fingerprint")
    page.set_input_files("#fp-file", str(f))
    page.click("#fp-button")
    page.wait_for_selector("#verdict")
    assert page.locator("#verdict").inner_text() == f"same: {GPT}"
    page.screenshot(path=str(SHOTS / "fingerprint.png"))
    assert outside == []


def test_writes_take_the_token_and_say_when_it_is_missing(site, browser_page):
    origin, _, _ = site
    page, outside = browser_page
    page.goto(origin + "/ui/models/Yi-6B")
    page.evaluate("sessionStorage.clear()")
    page.reload()
    page.click("button.write")
    assert "needs its token" in page.locator("#status").inner_text()
    assert page.locator("#availability").inner_text() == "yes"
    page.fill("#token", "wrong")
    page.dispatch_event("#token", "change")
    page.click("button.write")
    page.locator("#status", has_text="refused").wait_for()     # (a string to evaluate: the policy forbids it)
    page.fill("#token", TOKEN)
    page.dispatch_event("#token", "change")
    with page.expect_navigation():
        page.click("button.write")
    assert page.locator("#availability").inner_text() == "no"
    assert outside == []


def test_the_pages_and_the_api_docs_work_under_the_security_policy(site, browser_page):
    """The server sends `default-src 'self'`: the bars' widths and the legend's colours are set by the page's
    script, Swagger UI is started from a file, and the browser blocks nothing on any page (the other tests' pages
    included: this test runs last)."""
    origin, _, _ = site
    page, outside = browser_page
    page.goto(origin + "/")
    assert page.locator(".legend span").first.evaluate("e => getComputedStyle(e).backgroundColor") != "rgba(0, 0, 0, 0)"
    page.goto(origin + f"/ui/models/{GPT}")
    assert page.locator("td .bar").first.evaluate("e => e.getBoundingClientRect().width") > 1
    page.goto(origin + "/docs")
    page.wait_for_selector("#swagger-ui .swagger-ui", timeout=20_000)      # Swagger UI started from its file
    page.wait_for_selector("#swagger-ui .opblock", timeout=20_000)         # ...and it read the OpenAPI 3.1 document
    assert "Unable to render" not in page.content()
    assert BLOCKED == [] and outside == []
