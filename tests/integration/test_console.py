"""The console (/console) in a real browser: headless Chromium (Debian's
package) loads it from a real gateway with real workers after requests were
sent, with a key in the URL fragment; the numbers on the page equal what the
JSON endpoints and /metrics say; a key sees only its own requests, the admin
key all; the page is small, quick, and allows no inline script or other origin."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.tenancy.keys import KeyStore
from app.tools.embedded import run_gateway
from tests.integration.conftest import Workers, catalog_for

pytestmark = pytest.mark.integration
ADMIN = "jg-admin-console-test-0123456789abcdef"
MSG = [{"role": "user", "content": "Say hi."}]
ROOT = Path(__file__).resolve().parents[2]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("JOULEGATE_REQUIRE_CHROMIUM") == "1":
            pytest.fail("chromium is not installed (.ci/run installs it)")
        pytest.skip("no chromium: apt-get install chromium")
    return found


def browse(url: str, *extra: str) -> str:
    """The page's DOM after its script ran (up to 6 s of page time)."""
    with tempfile.TemporaryDirectory(prefix="joulegate-chromium-") as profile:
        out = subprocess.run(
            [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--no-first-run",
             "--virtual-time-budget=6000", "--window-size=1280,1000",
             *(extra or ("--dump-dom",)), url],
            capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


class Page(HTMLParser):
    """Elements by id (their data-* and text), and the request rows."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.by_id: dict[str, dict[str, Any]] = {}
        self.rows: list[list[str]] = []
        self.body: dict[str, str] = {}
        self._open: list[tuple[str, dict[str, Any]]] = []
        self._in_rows = False
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.body = a
        node = {"attrs": a, "text": ""}
        if "id" in a:
            self.by_id[a["id"]] = node
        if a.get("id") == "rows":
            self._in_rows = True
        if self._in_rows and tag == "tr":
            self.rows.append([])
        self._open.append((tag, node))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            t, _ = self._open.pop()
            if t == tag:
                break
        if tag == "tbody":
            self._in_rows = False

    def handle_data(self, data: str) -> None:
        for _, node in self._open:
            node["text"] += data
        if self._in_rows and self._open and self._open[-1][0] == "td" and self.rows:
            self.rows[-1].append(data)

    def value(self, id_: str) -> str:
        return str(self.by_id[id_]["attrs"].get("data-value"))


def test_the_console_shows_each_key_its_own_requests_in_a_real_browser(
        workers: Workers, tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'joulegate.db'}"
    store = KeyStore(database)
    _, team_a = store.create("team-a", joule_budget=1e6, budget_period="day")
    _, team_b = store.create("team-b")
    with run_gateway(catalog_for([workers.small], [workers.large]), state_dir=tmp_path,
                     database_url=database, admin_key=ADMIN) as gw:
        for secret, model in ((team_a, "small"), (team_a, "auto"), (team_b, "large")):
            r = httpx.post(gw.v1 + "/chat/completions", timeout=60,
                           headers={"authorization": f"Bearer {secret}"},
                           json={"model": model, "messages": MSG, "max_tokens": 4})
            assert r.status_code == 200, r.text
        page = httpx.get(gw.url + "/console")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "<script>" not in page.text and "style=" not in page.text  # nothing inline
        assert not re.search(r"(src|href)=\"(https?:)?//", page.text)  # no other origin
        weight = sum(len(httpx.get(gw.url + p).content)
                     for p in ("/console", "/console/console.js", "/console/console.css"))
        assert weight < 200_000

        def usage(secret: str) -> dict[str, Any]:
            out: dict[str, Any] = httpx.get(gw.v1 + "/usage", params={"since": "1h"},
                                            headers={"authorization": f"Bearer {secret}"}).json()
            return out

        import time
        time.sleep(1.0)  # the ledger writes rows every 0.5 s
        mine = Page(browse(f"{gw.url}/console#key={team_a}"))
        expect = usage(team_a)
        assert mine.value("t-requests") == str(expect["totals"]["requests"]) == "2"
        assert abs(float(mine.value("t-joules")) - expect["totals"]["energy_net_j"]) < 1e-6
        assert {r[1] for r in mine.rows} == {"team-a"} and len(mine.rows) == 2
        assert [r[2] for r in mine.rows] == ["auto", "small"]  # the model asked, newest first
        assert float(mine.value("t-saved")) == pytest.approx(
            expect["totals"]["saved_expected_j"], abs=1e-9)
        assert expect["totals"]["saved_expected_j"] == pytest.approx(sum(
            r["saved_j"] or 0.0 for r in expect["data"]))
        assert "team-b" not in str(mine.by_id["rows"])
        assert mine.by_id["budget-card"]["attrs"].get("hidden") is None
        assert float(mine.value("t-budget")) == pytest.approx(
            1e6 - expect["key"]["spent_j"], abs=1e-3)
        rendered_ms = int(mine.body["data-rendered-ms"])
        assert rendered_ms < 1000, rendered_ms
        # the device's power card, as /metrics says it (the estimate source here)
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'joulegate_device_power_watts{device="cpu"' in metrics
        assert 'data-device="cpu"' in browse(f"{gw.url}/console#key={team_a}")

        admin = Page(browse(f"{gw.url}/console#key={ADMIN}"))
        assert admin.value("t-requests") == str(usage(ADMIN)["totals"]["requests"]) == "3"
        assert {r[1] for r in admin.rows} == {"team-a", "team-b"}

        refused = Page(browse(f"{gw.url}/console#key=jg-not-a-key"))
        assert refused.by_id["keyform"]["attrs"].get("hidden") is None
        assert not refused.rows
        shot = os.environ.get("JOULEGATE_CONSOLE_PNG")
        if shot:  # the docs' screenshot: JOULEGATE_CONSOLE_PNG=docs/images/console.png
            browse(f"{gw.url}/console#key={ADMIN}", f"--screenshot={Path(shot).resolve()}")
        (tmp_path / "console.txt").write_text(f"weight {weight} B, rendered {rendered_ms} ms\n")
