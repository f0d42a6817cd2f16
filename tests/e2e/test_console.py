"""The browser console in a real headless Chromium against a real ``tarry serve`` with a token:
a user opens ``/console``, gives the token, filters the scheduled messages, cancels one,
reschedules one, peeks at a dead letter and redrives it; every result is checked through the API, the page's
JavaScript logs no error, and each view is saved as a screenshot in ``$TARRY_SCREENSHOTS``
(default ``test-artifacts/console/``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CHROMEDRIVER, CHROMIUM, ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.timeout(90)]

TOKEN = "console-secret"
CONFIG = f"""
[[auth.tokens]]
token = "{TOKEN}"
name = "operator"
admin = ["*"]
send = ["*"]
receive = ["*"]
read = ["*"]

[queues.orders]
dead_letter_to = "orders.dlq"
[queues."orders.dlq"]
[queues.billing]
[queues.news-a]

[topics]
news = ["news-a"]
"""
SCREENSHOTS = Path(
    os.environ.get("TARRY_SCREENSHOTS")
    or Path(__file__).resolve().parents[2] / "test-artifacts" / "console"
)
#: Chromium as this machine allows it: no sandbox (root), no network of its own.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def server(make_server: Callable[..., ServerProcess]) -> ServerProcess:
    return make_server(CONFIG)


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    ) as client:
        yield client


def _wait(driver: Any, condition: Callable[[], Any], what: str, timeout_s: float = 20) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # the element is not there yet, or went stale
            last = exc
        time.sleep(0.05)
    banner = driver.find_element("id", "banner").text
    raise AssertionError(f"timed out waiting for {what} (banner: {banner!r}; last: {last!r})")


def _open(driver: Any, view: str) -> None:
    driver.find_element("css selector", f'nav a[data-view="{view}"]').click()
    _wait(
        driver,
        lambda: driver.find_element("tag name", "body").get_attribute("data-loaded") == view,
        f"the {view} view",
    )


def _rows(driver: Any, table: str) -> list[Any]:
    return driver.find_elements("css selector", f"#{table} tbody tr[data-id]")


def _filter(driver: Any, **fields: str) -> None:
    driver.find_element("id", "f-clear").click()
    for field_id, value in fields.items():
        box = driver.find_element("id", field_id)
        box.clear()
        box.send_keys(value)
    driver.find_element("id", "f-apply").click()


def _shot(driver: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def _errors(driver: Any) -> list[dict[str, Any]]:
    """The browser log since the last read, errors and warnings only."""
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def _schedule(api: httpx.Client, destination: str, correlation_id: str, delay_ms: int) -> str:
    response = api.post(
        "/v1/messages",
        json={
            "destination": destination,
            "body": json.dumps({"order": correlation_id}),
            "headers": {"customer": "c-42"},
            "delay_ms": delay_ms,
            "correlation_id": correlation_id,
        },
    )
    response.raise_for_status()
    return str(response.json()["id"])


def _dead_letter(api: httpx.Client) -> str:
    """A message rejected by its consumer: dead-lettered into orders.dlq (reason rejected)."""
    api.post("/v1/messages", json={"destination": "orders", "body": "broken"}).raise_for_status()
    [got] = api.post("/v1/queues/orders/receive", json={"max": 1, "wait_ms": 5000}).json()[
        "messages"
    ]
    api.post("/v1/queues/orders/nack", json={"receipts": [got["receipt"]], "requeue": False})
    [dead] = api.get("/v1/messages", params={"destination": "orders.dlq"}).json()["items"]
    return str(dead["id"])


def test_operator_filters_cancels_reschedules_and_redrives_a_dead_letter_in_the_console(
    server: ServerProcess, api: httpx.Client, browser: Any
) -> None:
    # Given a server with a token, three orders and a bill scheduled, and one dead letter
    keep = _schedule(api, "orders", "keep-me", 10 * 60_000)
    cancel = _schedule(api, "orders", "cancel-me", 20 * 60_000)
    move = _schedule(api, "orders", "move-me", 30 * 60_000)
    _schedule(api, "billing", "bill", 40 * 60_000)
    dead = _dead_letter(api)
    policy = {"pattern": "^orders$", "definition": {"message_ttl_ms": 3_600_000}}
    api.put("/v1/policies/orders-ttl", json=policy).raise_for_status()

    # When the user opens the console and gives the token
    browser.get(f"{server.url}/console")
    # (without a token the server answers 401, which the browser logs as a failed request)
    before = _errors(browser)
    assert all(e["source"] == "network" and "401" in e["message"] for e in before), before
    browser.find_element("id", "token").send_keys(TOKEN)
    browser.find_element("css selector", "#token-form button[type=submit]").click()
    # Then the overview counts what is pending, per destination, with the forecast
    _wait(
        browser,
        lambda: browser.find_element("id", "total-scheduled").text.startswith("4"),
        "4 scheduled in the overview",
    )
    # (a call the page made before the token may answer 401 only now: the log is read again)
    late = _errors(browser)
    assert all(e["source"] == "network" and "401" in e["message"] for e in late), late
    orders_row = browser.find_element("css selector", '#destinations tr[data-name="orders"]')
    assert orders_row.text.split()[:3] == ["orders", "queue", "3"]
    assert browser.find_elements("css selector", "#forecast-hour svg rect")
    assert browser.find_element("id", "health").text == "healthy"
    _shot(browser, "overview")

    # When they filter the scheduled messages by destination
    _open(browser, "scheduled")
    _filter(browser, **{"f-destination": "orders"})
    # Then only the orders are listed, in due order
    _wait(
        browser,
        lambda: (
            [r.get_attribute("data-id") for r in _rows(browser, "messages")] == [keep, cancel, move]
        ),
        "the three orders in due order",
    )
    _shot(browser, "scheduled")

    # When they open the one to cancel (found by correlation id) and cancel it
    _filter(browser, **{"f-correlation": "cancel-me"})
    _wait(
        browser,
        lambda: [r.get_attribute("data-id") for r in _rows(browser, "messages")] == [cancel],
        "the message to cancel",
    )
    _rows(browser, "messages")[0].click()
    _wait(
        browser,
        lambda: browser.find_element("id", "detail").get_attribute("data-state") == "scheduled",
        "the message's detail",
    )
    assert '"order": "cancel-me"' in browser.find_element("id", "detail-body").text
    assert "c-42" in browser.find_element("id", "detail-headers").text
    browser.find_element("id", "body-hex").click()
    assert browser.find_element("id", "detail-body").text.startswith("00000000  7b 22")
    _shot(browser, "message-detail")
    browser.find_element("id", "detail-cancel").click()
    _wait(
        browser,
        lambda: "cancelled" in browser.find_element("id", "detail-result").text,
        "the cancel's answer",
    )
    # Then the API says it is cancelled
    assert api.get(f"/v1/messages/{cancel}").json()["state"] == "cancelled"
    browser.find_element("id", "detail-close").click()

    # When they reschedule another to two hours from now
    _filter(browser, **{"f-message-id": "", "f-correlation": "move-me"})
    _wait(
        browser,
        lambda: [r.get_attribute("data-id") for r in _rows(browser, "messages")] == [move],
        "the message to move",
    )
    _rows(browser, "messages")[0].click()
    _wait(
        browser,
        lambda: browser.find_element("id", "detail").get_attribute("data-state") == "scheduled",
        "the message's detail",
    )
    asked_ms = time.time() * 1000
    browser.find_element("id", "reschedule-to").send_keys("2h")
    browser.find_element("id", "detail-reschedule").click()
    _wait(
        browser,
        lambda: "now due" in browser.find_element("id", "detail-result").text,
        "the reschedule's answer",
    )
    # Then the API has it due two hours later
    due = api.get(f"/v1/messages/{move}").json()["deliver_at"]
    assert asked_ms + 2 * 3_600_000 - 60_000 < due < time.time() * 1000 + 2 * 3_600_000
    browser.find_element("id", "detail-close").click()

    # When they look at queues, topics and policies
    _open(browser, "topology")
    queue_row = browser.find_element("css selector", '#queues tr[data-name="orders"]')
    assert "dead_letter_to=orders.dlq" in queue_row.text
    assert "message_ttl_ms=3600000" in queue_row.text  # in force, from the policy
    assert queue_row.text.endswith("orders-ttl")
    assert (
        "^orders$"
        in browser.find_element("css selector", '#policies tr[data-name="orders-ttl"]').text
    )
    assert "news-a" in browser.find_element("css selector", '#topics tr[data-name="news"]').text
    _shot(browser, "topology")

    # When they look at the dead letters and peek at one
    _open(browser, "dead")
    group = _wait(
        browser,
        lambda: [
            r.text
            for r in browser.find_elements("css selector", "#dead-groups tbody tr")
            if "orders.dlq" in r.text
        ],
        "the dead-letter group",
    )
    assert group[0].split()[:4] == ["orders.dlq", "rejected", "orders", "1"]
    _wait(
        browser,
        lambda: [r.get_attribute("data-id") for r in _rows(browser, "dead-messages")] == [dead],
        "the dead letter in orders.dlq",
    )
    _shot(browser, "dead-letters")
    _rows(browser, "dead-messages")[0].find_elements("tag name", "td")[2].click()
    _wait(
        browser,
        lambda: "rejected" in browser.find_element("id", "detail-deaths").text,
        "the dead letter's deaths",
    )
    assert browser.find_element("id", "detail-body").text == "broken"
    _shot(browser, "dead-letter-detail")
    browser.find_element("id", "detail-close").click()

    # When they select that dead letter and redrive it
    _rows(browser, "dead-messages")[0].find_element("css selector", "input.pick").click()
    browser.find_element("id", "redrive-selected").click()
    _wait(
        browser,
        lambda: browser.find_element("id", "redrive-result").text.startswith("moved 1,"),
        "the redrive's answer",
    )
    _wait(browser, lambda: not _rows(browser, "dead-messages"), "the dead-letter queue emptied")
    _shot(browser, "dead-letters-redriven")
    # Then it arrives at its original destination, a new message linked to the dead letter,
    # with its deaths kept (checked through the API)
    got = api.post("/v1/queues/orders/receive", json={"max": 10, "wait_ms": 5000}).json()
    [back] = got["messages"]
    assert (back["body"], back["headers"]["tarry-redriven-from"]) == ("broken", dead)
    assert back["id"] != dead and back["deaths"][0]["reason"] == "rejected"

    # Then the page logged no error once it had the token (no JavaScript error, no failed call)
    assert _errors(browser) == []
    # and nothing the user did not ask for changed
    assert api.get(f"/v1/messages/{keep}").json()["state"] == "scheduled"
