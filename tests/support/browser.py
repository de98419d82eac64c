"""Debian's chromium, headless, driven over the DevTools protocol: open a page, evaluate JavaScript in it,
wait for a condition the page's own scripts make true, take a screenshot.

The browser is a real process started here (``--remote-debugging-port=0``: it writes the port it chose
to ``DevToolsActivePort`` in its profile directory). The protocol is JSON over a websocket (aiohttp's
client, behind a synchronous API: one request at a time, events other than errors ignored). Nothing is
fetched from the network but the pages asked for: no sync, no component updates, no first-run pages.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = "chromium"
START = 30.0  # bound for the browser to start listening
FLAGS = [
    "--headless",
    "--no-sandbox",  # tests run as root in containers, where chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-dev-shm-usage",  # containers' /dev/shm is small
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


class BrowserError(AssertionError):
    """The browser did not start, a command failed, or a page threw."""


def chromium_binary() -> str:
    found = shutil.which(CHROMIUM)
    if found is None:
        raise BrowserError("chromium is not installed: run `make setup` (apt-get install chromium)")
    return found


class Chromium:
    """One headless browser with one tab; ``close()`` (or ``with``) ends the process."""

    def __init__(self, directory: Path, width: int = 1400, height: int = 900) -> None:
        self.directory = directory
        profile = directory / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        self.log = directory / "chromium.stderr"
        with open(self.log, "wb") as stderr:
            self.process = subprocess.Popen(
                [chromium_binary(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        self.errors: list[str] = []  # exceptions thrown and errors logged by the page
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._session: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        try:
            self._run(self._connect(self._browser_url(profile / "DevToolsActivePort")))
            target = self.command("Target.createTarget", url="about:blank")["targetId"]
            self._page = self.command("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.command(f"{domain}.enable", session=self._page)
            self.command(
                "Emulation.setDeviceMetricsOverride",
                session=self._page,
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the page ----------------------------------------------------------------------------------
    def open(self, url: str) -> None:
        self.command("Page.navigate", session=self._page, url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if a promise), as JSON gives it."""
        reply = self.command(
            "Runtime.evaluate",
            session=self._page,
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        if "exceptionDetails" in reply:
            raise BrowserError(f"{expression} threw: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout: float = 30.0) -> Any:
        """Evaluate ``expression`` until it is truthy; its value. Fails naming ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not (value := self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise BrowserError(
                    f"timed out after {timeout} s waiting for {what}; page errors: {self.errors}"
                )
            time.sleep(0.1)
        return value

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (not only the window) at ``path``."""
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        reply = self.command(
            "Page.captureScreenshot",
            session=self._page,
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": self.evaluate("innerWidth"), "height": height, "scale": 1},
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(reply["data"]))
        return path

    # -- protocol ----------------------------------------------------------------------------------
    def command(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        return dict(self._run(self._command(method, session, params)))

    def _browser_url(self, port_file: Path) -> str:
        deadline = time.monotonic() + START
        while not (port_file.exists() and len(lines := port_file.read_text().split()) == 2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise BrowserError(f"chromium did not start: {self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        return f"ws://127.0.0.1:{lines[0]}{lines[1]}"

    def _run(self, work: Any) -> Any:
        return self._loop.run_until_complete(asyncio.wait_for(work, timeout=60))

    async def _connect(self, url: str) -> None:
        self._session = aiohttp.ClientSession()
        self._socket = await self._session.ws_connect(url, max_msg_size=0)

    async def _command(self, method: str, session: str | None, params: dict[str, Any]) -> dict[str, Any]:
        assert self._socket is not None
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        await self._socket.send_str(json.dumps(message))
        while True:
            received = await self._socket.receive()
            if received.type is not aiohttp.WSMsgType.TEXT:
                raise BrowserError(f"the DevTools connection ended during {method}: {received}")
            reply = json.loads(received.data)
            if reply.get("id") == ident:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self._note(reply)

    def _note(self, event: dict[str, Any]) -> None:
        params = event.get("params", {})
        if event.get("method") == "Runtime.exceptionThrown":
            self.errors.append(json.dumps(params.get("exceptionDetails", {}))[:2000])
        elif event.get("method") == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.errors.append(str(params["entry"].get("text")))

    def close(self) -> None:
        """End the browser; safe to call twice."""
        if self._socket is not None:
            self._run(self._socket.close())
            self._socket = None
        if self._session is not None:
            self._run(self._session.close())
            self._session = None
        if not self._loop.is_closed():
            self._loop.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
