"""Open a job report in headless Chromium (Debian's) and say what it drew and which requests
it made: every plot's SVG size and its drawn paths' boxes, and the URL of every request the
page sent (Chrome's performance log).

Run by Superset's own Python (.venv-superset ships Selenium), not by pytest:
`python report_browser.py URL` prints one JSON document. Host names other than 127.0.0.1
resolve nowhere (--host-resolver-rules), and every request is listed, so a report that
tried to load anything would show it here.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
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
    "--window-size=1000,2000",
)
_PLOTS_JS = """
return Array.from(document.querySelectorAll('svg.plot')).map(svg => {
  const box = svg.getBoundingClientRect();
  const paths = Array.from(svg.querySelectorAll('path')).map(p => {
    const b = p.getBBox();
    return {width: b.width, height: b.height, length: p.getTotalLength()};
  });
  return {id: svg.parentElement.id, width: box.width, height: box.height, paths};
});
"""


def main(url: str) -> None:
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager never looks for a driver online
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='jobscope-report-')}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(60)
        driver.get(url)
        deadline = time.monotonic() + 30
        while driver.execute_script("return document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not finish loading")
            time.sleep(0.1)
        plots = driver.execute_script(_PLOTS_JS)
        requests = []
        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                requests.append(message["params"]["request"]["url"])
        print(json.dumps({"title": driver.title, "plots": plots, "requests": requests}))
    finally:
        driver.quit()


if __name__ == "__main__":
    main(sys.argv[1])
