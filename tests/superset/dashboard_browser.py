"""Open a Superset dashboard in headless Chromium (Debian's) and report what every chart shows.

Run by Superset's own Python (.venv-superset: Selenium ships with Superset), not by pytest:

    python dashboard_browser.py URL USER PASSWORD DASHBOARD_PATH SCREENSHOT TIMEOUT_S [LOGIN]

Logs in (LOGIN `form`, the default: Superset's own form; `oidc`: through the OpenID Connect
provider's login page, as a site's users do), opens the dashboard, waits until every chart has
finished (drawn, or an error or "No results" message), saves a screenshot and prints one JSON
object: the charts by title, each with its state ("rendered", "error", "empty" or "loading" on
timeout), its text and, for tables, its rows as lists of cell texts.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# No network but loopback: no background requests, updates, sync or QUIC, and no host name
# resolves.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--window-size=1600,2400",
)

# Every chart holder: its title, its state, its text, its table rows.
_CHARTS_JS = """
return Array.from(document.querySelectorAll('[data-test="dashboard-component-chart-holder"]'))
  .map(holder => {
    const title = (holder.querySelector('[data-test="editable-title"]') || {}).innerText || '';
    const text = holder.innerText;
    const loading = holder.querySelector('.loading, [data-test="loading-indicator"]');
    // Drawn: an ECharts canvas, a table row with cells, a big number.
    const drawn = holder.querySelector(
      '[_echarts_instance_] canvas, table tbody tr td, .header-line');
    let state = 'loading';
    if (/No results|No data/i.test(text)) state = 'empty';
    else if (holder.querySelector('.ant-alert-error') || /Data error|Unexpected error/.test(text))
      state = 'error';
    else if (drawn && !loading) state = 'rendered';
    const rows = Array.from(holder.querySelectorAll('table tbody tr'))
      .map(tr => Array.from(tr.querySelectorAll('td')).map(td => td.innerText.trim()));
    return {title: title.trim(), state, text, rows};
  });
"""


def browse(
    url: str,
    user: str,
    password: str,
    path: str,
    screenshot: str,
    timeout: float,
    login: str = "form",
) -> dict:
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager never looks for a driver online
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="jobscope-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(timeout)
        driver.get(url + LOGIN_PAGES[login][0])
        if not _wait(lambda: _log_in(driver, url, user, password, login), timeout):
            raise RuntimeError(f"could not log in as {user} ({login}) at {url}")
        driver.get(url + path)
        charts: list[dict[str, Any]] = []

        def finished() -> bool:
            nonlocal charts
            driver.execute_script("window.scrollTo(0, document.body.scrollHeight)")
            charts = driver.execute_script(_CHARTS_JS)
            return bool(charts) and all(c["state"] != "loading" for c in charts)

        done = _wait(finished, timeout)
        driver.execute_script("window.scrollTo(0, 0)")
        driver.save_screenshot(screenshot)
        return {"finished": done, "url": driver.current_url, "charts": charts}
    finally:
        driver.quit()


LOGIN_PAGES = {
    # Superset's own form, drawn by React: keys typed before it is ready are lost
    "form": ("/login/", (By.CSS_SELECTOR, '[data-test="login-button"]')),
    # the provider's page (Keycloak's form: username, password, `kc-login`)
    "oidc": ("/login/oidc", (By.ID, "kc-login")),
}


def _log_in(driver: webdriver.Chrome, url: str, user: str, password: str, login: str) -> bool:
    """One attempt at the login page of `login`; True once the browser is back on Superset,
    logged in (hence attempts until one succeeds)."""

    def logged_in() -> bool:
        return driver.current_url.startswith(url) and "/login" not in driver.current_url

    if logged_in():
        return True
    fields = driver.find_elements(By.ID, "username") + driver.find_elements(By.ID, "password")
    buttons = driver.find_elements(*LOGIN_PAGES[login][1])
    if len(fields) < 2 or not buttons:
        return False
    for field, value in zip(fields, (user, password), strict=True):
        field.clear()
        field.send_keys(value)
    buttons[0].click()
    return _wait(logged_in, 10)


def _wait(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return False


if __name__ == "__main__":
    url, user, password, path, screenshot, timeout = sys.argv[1:7]
    login = sys.argv[7] if len(sys.argv) > 7 else "form"
    print(json.dumps(browse(url, user, password, path, screenshot, float(timeout), login)))
