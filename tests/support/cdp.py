"""A headless Chromium driven over the Chrome DevTools Protocol (no selenium, no driver binary).

Debian's ``chromium`` is started with ``--remote-debugging-port``; commands go over one
WebSocket to the page target with the ``websockets`` package Airflow already depends on.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from support import processes
from support.ports import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-dev-shm-usage", "--hide-scrollbars")


class Browser:
    """One Chromium process with a fresh profile and one page; stop it with :meth:`close`."""

    def __init__(self, width: int = 1400, height: int = 1600) -> None:
        if CHROMIUM is None:
            raise RuntimeError("chromium is not installed: run include/test_deps.sh (apt-get install chromium)")
        from websockets.sync.client import connect

        self.profile_dir = tempfile.mkdtemp(prefix="vcloud-chromium-")
        port = free_port()
        self.log = open(Path(self.profile_dir) / "chromium.log", "w")
        self.proc = subprocess.Popen(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile_dir}", f"--remote-debugging-port={port}",
             "--remote-debugging-address=127.0.0.1", f"--window-size={width},{height}", "about:blank"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        target = self._page_target(port)
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(
            connect(target["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024, open_timeout=20))
        self._ids = itertools.count(1)
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def _page_target(self, port: int, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as resp:
                    pages = [t for t in json.load(resp) if t.get("type") == "page"]
                if pages:
                    return pages[0]
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not open its debugging port (log: {self.log.name})")
            time.sleep(0.2)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One CDP command; events that arrive meanwhile are skipped."""
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method} failed: {reply['error']}")
                return reply.get("result", {})

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout: float = 60, what: str = "") -> Any:
        """Evaluate until truthy (the page loads data asynchronously)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError as exc:  # the page is navigating (no document.body yet): not yet true
                last = str(exc)
            else:
                if value:
                    return value
                last = value
            time.sleep(0.3)
        url = self.evaluate("location.href")
        raise AssertionError(f"timed out waiting for {what or expression} (at {url}; last value {last!r})")

    def type_into(self, selector: str, text: str) -> None:
        """Focus the element and type like a person (frameworks see real input events)."""
        if not self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                             "if (!e) return false; e.focus(); e.select?.(); return true; })()"):
            raise AssertionError(f"no element {selector} on {self.evaluate('location.href')}")
        self.send("Input.insertText", text=text)

    def press_enter(self) -> None:
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13,
                      nativeVirtualKeyCode=13, **({"text": "\r"} if kind == "keyDown" else {}))

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=False)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            processes.stop(self.proc, whole_group=True, grace=10)
            self.log.close()
            shutil.rmtree(self.profile_dir, ignore_errors=True)
