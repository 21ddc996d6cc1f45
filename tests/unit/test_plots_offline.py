"""`dvc plots show` draws every chart with the network blocked, checked in headless Chromium.

A tiny DVC repository in tmp declares line, bar and image plots from
synthetic files and renders them with the repository's `.dvc/config` and
page template. Chromium opens the page with every host unresolvable and a
proxy that goes nowhere; the DevTools protocol (over a pipe, no extra
packages) records each request the page makes, counts what each chart drew
and takes a screenshot. The same page built with dvc's default template,
which loads vega from a CDN, must draw nothing: that shows the blocking bites.

    python -m tests.unit.test_plots_offline OUT.png   # screenshot of this repo's own plots page
"""

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")

# Network off: every host name fails to resolve, and what would bypass the
# resolver through a proxy meets a closed port (9, discard). The rest keeps a
# fresh profile from calling home on its own.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
    "--remote-debugging-pipe", "--window-size=1280,900", "--hide-scrollbars",
]

# Per vega chart: the number of pixels in its canvas that are neither blank
# nor the white background (vega-embed draws on a canvas by default), so a chart counts as drawn
# only when vega put axes and data into it. Images count when they decoded;
# readyState says the parser has reached them all.
COUNT_JS = """(() => {
  const charts = {};
  for (const id of %s) {
    const div = document.getElementById(id);
    const canvas = div && div.querySelector('.vega-embed canvas');
    let painted = 0;
    if (canvas && canvas.width && canvas.height) {
      const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
      for (let i = 0; i < px.length; i += 4) {
        if (px[i + 3] > 0 && (px[i] < 250 || px[i + 1] < 250 || px[i + 2] < 250)) painted++;
      }
    }
    charts[id] = painted;
  }
  const images = [...document.images].map(i => i.complete && i.naturalWidth > 0);
  return {charts, images, complete: document.readyState === 'complete'};
})()"""


def chromium() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@dataclass
class Page:
    """What one page load left behind: pixels per chart, decoded images, requests, a screenshot."""

    charts: dict[str, int]
    images: list[bool]
    requests: list[str] = field(default_factory=list)
    screenshot: bytes = b""

    def remote_requests(self) -> list[str]:
        """Requests that would have left the machine; file: and data: stay on it."""
        return [u for u in self.requests if not u.startswith(("file:", "data:", "blob:", "about:"))]


class Browser:
    """Headless Chromium driven by the DevTools protocol over --remote-debugging-pipe (fds 3 and 4)."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def wire_fds() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes replies
            high_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)  # out of the way of 3 and 4 first
            high_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self._proc = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      preexec_fn=wire_fds, pass_fds=(3, 4))
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_chrome], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._from_chrome, 1 << 20) if ready else b""
            if not chunk:
                raise TimeoutError("Chromium did not answer over the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile are kept in self.events."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def load(self, url: str, chart_ids: list[str], timeout: float = 8.0) -> Page:
        """Open url in a new tab and wait until every chart is drawn or the time is up."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.events.clear()
        for domain in ("Network.enable", "Page.enable"):
            self.call(domain, session=session)
        self.call("Page.navigate", {"url": url}, session=session)
        deadline = time.monotonic() + timeout
        while True:
            found = self.call("Runtime.evaluate", {"expression": COUNT_JS % json.dumps(chart_ids),
                                                   "returnByValue": True}, session=session)["result"]["value"]
            drawn = found["complete"] and all(found["charts"].values()) and all(found["images"])
            if drawn or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        page = Page(found["charts"], found["images"])
        page.requests = [e["params"]["request"]["url"] for e in self.events
                         if e.get("method") == "Network.requestWillBeSent"]
        page.screenshot = self._screenshot(session)
        self.call("Target.closeTarget", {"targetId": target})
        return page

    def _screenshot(self, session: str) -> bytes:
        size = self.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True},
                         session=session)
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5.0)
        except (TimeoutError, OSError, RuntimeError):
            pass  # already gone
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


def vega_chart_ids(html: str) -> list[str]:
    """The element ids dvc-render passes to vegaEmbed with a spec to draw, one per interactive chart.

    A plot file with a header and no rows (a skipped variant's steps) gets
    `var spec = {};` from dvc-render: there is nothing to draw, online or not.
    """
    parts = html.split("vegaEmbed('#")
    return [after.split("'", 1)[0] for before, after in zip(parts, parts[1:])
            if not before.rstrip().endswith("var spec = {};")]


def dvc(repo: Path, *args: str) -> None:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"dvc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


def tiny_repo(repo: Path) -> None:
    """A DVC repository with this repo's plots config, two loss curves, a bar chart and a PNG."""
    shutil.copytree(ROOT / ".dvc", repo / ".dvc", ignore=shutil.ignore_patterns("cache", "tmp", "config.local"))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "steps").mkdir()
    for name, slope in (("base", 0.10), ("fast", 0.11)):
        rows = "".join(f"{i},{8.0 - slope * i:.3f}\n" for i in range(20))
        (repo / "steps" / f"{name}.csv").write_text("step,loss\n" + rows)
    (repo / "summary.csv").write_text("variant,tokens_per_sec\nbase,1000\nfast,1800\n")
    (repo / "figures").mkdir()
    import matplotlib.pyplot as plt  # only here: the rest of this module needs no matplotlib

    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1], [1, 0])
    fig.savefig(repo / "figures" / "curve.png")
    plt.close(fig)
    (repo / "dvc.yaml").write_text(
        "plots:\n"
        "  - steps/base.csv: {x: step, y: loss}\n"
        "  - steps/fast.csv: {x: step, y: loss}\n"
        "  - summary.csv: {x: tokens_per_sec, y: variant, template: bar_horizontal}\n"
        "  - figures\n"
    )


# The pages are rendered once per worker that runs this module's tests (xdist's `load` schedule sends
# consecutive tests to a worker, so usually one; xdist_group marks no longer pin it under pytest 9).


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Page, list[str]]]:
    """The tiny repo's page built with our template and with dvc's default one, each loaded offline."""
    binary = chromium()
    if binary is None:
        pytest.skip(f"no Chromium found (tried {', '.join(BROWSERS)}); `apt-get install -y chromium` (.ci/run does)")
    repo = tmp_path_factory.mktemp("plots_repo")
    tiny_repo(repo)
    from dvc_render.html import PAGE_HTML  # dvc's own page: scripts from a CDN

    (repo / "cdn_page.html").write_text(PAGE_HTML)
    dvc(repo, "plots", "show", "-o", "offline")
    dvc(repo, "plots", "show", "-o", "cdn", "--html-template", str(repo / "cdn_page.html"))
    browser = Browser(binary, tmp_path_factory.mktemp("chromium_profile"))
    out = {}
    try:
        for name, timeout in (("offline", 30.0), ("cdn", 2.0)):  # generous: a loaded 2-core CI machine
            index = repo / name / "index.html"
            ids = vega_chart_ids(index.read_text())
            out[name] = (browser.load(index.as_uri(), ids, timeout), ids)
    finally:
        browser.close()
    return out


def test_offline_page_draws_every_chart(pages: dict[str, tuple[Page, list[str]]], tmp_path: Path) -> None:
    page, ids = pages["offline"]
    assert len(ids) == 3  # two loss curves and the bar chart
    undrawn = [i for i in ids if page.charts.get(i, 0) < 500]  # a drawn chart paints thousands of pixels
    assert not undrawn, f"charts not drawn offline: {undrawn} ({page.charts})"
    assert page.images == [True]
    (tmp_path / "offline.png").write_bytes(page.screenshot)
    assert page.screenshot.startswith(b"\x89PNG")


def test_offline_page_makes_no_network_request(pages: dict[str, tuple[Page, list[str]]]) -> None:
    page, _ = pages["offline"]
    assert page.requests, "the DevTools log saw no request at all; the check would be blind"
    assert page.remote_requests() == []


def test_default_cdn_page_draws_nothing_offline(pages: dict[str, tuple[Page, list[str]]]) -> None:
    """The control: dvc's own page tries the CDN, is refused, and stays blank."""
    page, ids = pages["cdn"]
    assert any("cdn.jsdelivr.net" in url for url in page.remote_requests())
    assert all(page.charts.get(i, 0) == 0 for i in ids)


def screenshot_repo_page(out: Path) -> None:
    """Render this repository's plots with `dvc plots show` and save a full-page screenshot taken offline."""
    binary = chromium()
    assert binary, "no Chromium found"
    with tempfile.TemporaryDirectory() as tmp:
        dvc(ROOT, "plots", "show", "-o", str(Path(tmp) / "page"))
        index = Path(tmp) / "page" / "index.html"
        ids = vega_chart_ids(index.read_text())
        empty = index.read_text().count("vegaEmbed('#") - len(ids)
        browser = Browser(binary, Path(tmp) / "profile")
        try:
            page = browser.load(index.as_uri(), ids, timeout=15.0)
        finally:
            browser.close()
    out.write_bytes(page.screenshot)
    drawn = sum(1 for i in ids if page.charts.get(i, 0) >= 500)
    print(f"{drawn}/{len(ids)} charts with data drawn ({empty} empty plot files have no chart), "
          f"images {page.images}, remote requests {page.remote_requests()}; wrote {out}")


if __name__ == "__main__":
    screenshot_repo_page(Path(sys.argv[1]))
