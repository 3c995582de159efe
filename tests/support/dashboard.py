"""The dashboard's test helpers: an ASGI or WSGI app served for real on 127.0.0.1 (uvicorn or
werkzeug in a thread), and a headless Chromium driven through chromedriver."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve_asgi(asgi_app: Any) -> Iterator[str]:
    """``asgi_app`` on a free port; yields its base URL."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(asgi_app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def serve_wsgi(wsgi_app: Any) -> Iterator[str]:
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, wsgi_app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


def chromium() -> Any:
    """A headless Chromium (Debian's chromium and chromium-driver, which
    scripts/ensure-services.sh installs)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1000")
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(120)
    return driver


def screenshot_dir(default: Path) -> Path:
    """Where screenshots go: $DBQUEUE_SCREENSHOTS, else the test run's temporary directory."""
    chosen = Path(os.environ.get("DBQUEUE_SCREENSHOTS") or default)
    chosen.mkdir(parents=True, exist_ok=True)
    return chosen
