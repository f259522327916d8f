"""Take docs/images/admin-run-list.png: the admin's run list after the demo, in Chromium.

Run by hand (not part of the test suite):

    apt-get install chromium chromium-driver
    .venv/bin/pip install selenium
    .venv/bin/python docs/images/take_admin_screenshot.py

It runs the demo into a scratch directory (SQLite + filesystem broker), creates an
admin user there, serves the demo project with ``runserver``, logs in with headless
Chromium and saves the run list.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "docs" / "images" / "admin-run-list.png"
PORT = 8765


def main() -> None:
    var = Path(tempfile.mkdtemp(prefix="cd-screenshot-"))
    env = {
        **os.environ,
        "DEMO_VAR_DIR": str(var),
        "DJANGO_SETTINGS_MODULE": "demo_project.settings",
    }
    subprocess.run([sys.executable, "-m", "demo_project.run_demo"], cwd=REPO, env=env, check=True)
    subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from django.contrib.auth.models import User; "
         "User.objects.create_superuser('operator', 'ops@example.com', 'demo-password')"],
        cwd=REPO, env=env, check=True,
    )  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{PORT}", "--noreload"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/admin/login/")
                break
            except OSError:
                time.sleep(0.1)
        options = webdriver.ChromeOptions()
        for flag in ("--headless=new", "--no-sandbox", "--window-size=1900,900"):
            options.add_argument(flag)
        browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            browser.get(f"http://127.0.0.1:{PORT}/admin/login/?next=/admin/celery_deadlines/run/")
            browser.find_element(By.NAME, "username").send_keys("operator")
            browser.find_element(By.NAME, "password").send_keys("demo-password")
            browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
            browser.get(f"http://127.0.0.1:{PORT}/admin/celery_deadlines/run/")
            assert "order-43" in browser.page_source, "the demo's runs are not listed"
            browser.save_screenshot(str(OUTPUT))
        finally:
            browser.quit()
    finally:
        server.terminate()
        server.wait(10)
    print(f"saved {OUTPUT}")


if __name__ == "__main__":
    main()
