"""The status page in a real browser (Playwright driving Debian's chromium, headless) against a real
`failsoft serve`: the login, the VRAM bar, a job awaiting approval approved from the page, and the page
following the service live. Screenshots at desktop and phone width go to $FAILSOFT_SCREENSHOTS when set
(docs/screenshots/ holds the ones in the README), else to the test's own folder.

In CI a missing chromium or playwright is a failure, not a skip: `make system-deps` installs chromium and
the dev dependencies install playwright; only outside CI may this test skip without them."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.helpers import arm, base_settings, client_for, failsoft_of, seeded_chat, wait_replaced
from tests.support.service import ServiceHandle, module_service
from tests.support.waits import wait_until
from tests.view.test_remote_bars import ATTIC_BOX, DOWN, NAS_BOX, NAS_SHARE
from tray_app.server.status_page.routes import remote_view

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
# Headless, and nothing that reaches outside this machine.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REQUEST = seeded_chat(max_tokens=40, seed=5)
SETTINGS = {
    **base_settings(failover={"cpu_tokens_per_second": 1.0}),  # 40 tokens: 40 s, past 30 s
    # A channel with a secret in its path: the page shows where it sends, the host only.
    "notify": [{"kind": "webhook", "name": "hook", "url": "http://127.0.0.1:9/secret-path"}],
}


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(
            f"{what} is missing in CI: make system-deps installs chromium, .[dev] installs playwright"
        )
    pytest.skip(f"{what} is not installed (make system-deps; pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package")
    if not CHROMIUM.exists():
        _missing(str(CHROMIUM))
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


svc = module_service(enable_faults=True, settings=SETTINGS)


def screenshots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("FAILSOFT_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def logged_in_page(browser: Any, svc: ServiceHandle, width: int, height: int) -> Any:
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.goto(svc.base_url + "/ui/")
    page.wait_for_selector("#login:not([hidden])")
    page.fill("#token", "not the token")
    page.click("#login button")
    page.wait_for_selector("#login-error:has-text('not this service')")
    page.fill("#token", svc.admin_token)
    page.click("#login button")
    page.wait_for_selector("#app:not([hidden])")
    page.wait_for_selector("#bar span[data-key='weights']")
    return page


def test_the_page_shows_the_budget_and_approves_a_job(
    browser: Any, svc: ServiceHandle, tmp_path: Path
) -> None:
    armed = arm(svc, "abort", after_tokens=2)
    outcome: dict[str, Any] = {}

    def ask() -> None:
        try:
            outcome["answer"] = client_for(svc).chat.completions.create(
                **REQUEST, extra_headers={"X-Failsoft-Deadline": "30"}
            )
        except openai.APIStatusError as error:
            outcome["error"] = error

    desktop = logged_in_page(browser, svc, 1280, 900)
    cookies = desktop.context.cookies()
    assert [(c["name"], c["httpOnly"], c["sameSite"]) for c in cookies] == [
        ("failsoft_session", True, "Strict")
    ]
    assert desktop.evaluate("document.cookie") == ""  # HttpOnly: the page's script never holds it
    thread = threading.Thread(target=ask)
    thread.start()
    # The job appears without a reload: the event stream tells the page.
    row = desktop.wait_for_selector("#approvals li[data-job]", timeout=60_000)
    job_id = row.get_attribute("data-job")
    assert job_id and job_id.startswith("job-")
    assert desktop.inner_text("#live") == "live"
    assert "Weights" in desktop.inner_text("#legend")
    assert desktop.inner_text("#total") == "4.00 GiB on simulated GPU [SIMULATED]"  # never passed off as real
    assert desktop.inner_text("#approvals-count") == "1"
    channels = desktop.inner_text("#notify")
    assert "hook · webhook → http://127.0.0.1:9" in channels and "secret-path" not in channels
    folder = screenshots(tmp_path)
    desktop.screenshot(path=str(folder / "status-page-desktop.png"), full_page=True)
    phone = logged_in_page(browser, svc, 390, 844)
    phone.wait_for_selector(f"#approvals li[data-job='{job_id}']")
    phone.screenshot(path=str(folder / "status-page-phone.png"), full_page=True)
    phone.context.close()

    desktop.click(f"#approvals li[data-job='{job_id}'] button.approve")
    desktop.wait_for_selector("#flash:not([hidden])")
    assert desktop.inner_text("#flash").startswith(f"approved: {job_id} runs on the CPU, about ")
    thread.join(180)
    info = failsoft_of(outcome["answer"])
    assert (info["job_id"], info["worker"]) == (job_id, "cpu")
    desktop.wait_for_selector("#no-approvals:not([hidden])")  # gone from the list, live
    desktop.wait_for_selector(f"#failovers li:has-text('{job_id}')")
    desktop.context.close()
    wait_replaced(svc, armed["pid"])


def test_without_a_login_the_page_shows_only_the_login(browser: Any, svc: ServiceHandle) -> None:
    context = browser.new_context()
    page = context.new_page()
    response = page.goto(svc.base_url + "/ui/")
    assert response is not None and response.status == 200
    page.wait_for_selector("#login:not([hidden])")
    assert page.is_hidden("#app")
    answer = page.evaluate("fetch('/failsoft/view').then(r => r.status)")
    assert answer == 401
    wait_until(lambda: page.inner_text("#live") == "logged out", what="the page to say it is logged out")
    context.close()


def test_rpc_boxes_show_under_the_budget_bar(browser: Any, svc: ServiceHandle) -> None:
    """The service's own answer with an RPC box's share and a box that does not answer added: this service
    has no boxes, and the page draws whatever `/failsoft/view` says."""

    def with_boxes(route: Any) -> None:
        view = route.fetch().json()
        view["status"]["rpc"] = {"boxes": [NAS_BOX, ATTIC_BOX], "remote": [NAS_SHARE]}
        view["bar"].update(remote_view(view["status"]))  # as the service says it with these boxes
        route.fulfill(json=view)

    page = logged_in_page(browser, svc, 1280, 900)
    assert page.is_hidden("#remote")  # no boxes here
    page.route("**/failsoft/view", with_boxes)
    page.reload()
    page.wait_for_selector("#remote:not([hidden])")
    share = page.inner_text("#remote .remote-share[data-key='rpc:RPC0'] p")
    assert share == (
        "RPC0 · nas (192.168.1.30:50052) · 5 of 31 layers (blocks 26-29 and the output layer) · "
        "1.00 GiB of 5.50 GiB usable"
    )
    keys = page.eval_on_selector_all("#remote .bar span", "spans => spans.map(s => s.dataset.key)")
    assert keys == ["weights", "kv", "compute", "free"]
    colour = "span => getComputedStyle(span).backgroundColor"
    assert page.eval_on_selector("#remote .bar span[data-key='kv']", colour) == page.eval_on_selector(
        "#bar span[data-key='kv']", colour
    )
    assert page.inner_text("#remote p.error") == f"attic (192.168.1.40:50052): not used - {DOWN}"
    page.context.close()
