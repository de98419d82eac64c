"""The daemon's page (``GET /``) in a real headless browser, against a table with a history worth drawing.

The table is made by real writer processes: two writers that overlap in time and both commit, a writer
that loses a conflict and is rolled back, a writer killed mid-write and rolled back, a live writer still
pending, and a killed writer whose rollback waits because another process holds the table lock (so its
stale heartbeat stays on show). Chromium (Debian's package, started here) loads the page from an
in-process daemon; the test reads what the page's scripts drew, keeps a screenshot in ``tests/artifacts/``
(git-ignored; its path is printed), then frees the lock and watches the page redraw itself.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import TESTS
from support.browser import Chromium
from support.daemon import (
    Processes,
    Target,
    count,
    get,
    kill,
    polls_later,
    port_of,
    serving,
    wait_until,
    writer,
)
from support.tables import rows

from cowrite.cli import EXIT_CONFLICT
from cowrite.daemon.config import TableEntry
from cowrite.format import config as keys
from cowrite.format.instant import from_millis
from cowrite.protocol.heartbeat import heartbeat_path
from cowrite.protocol.locks.holders import current_lock

ARTIFACTS = TESTS / "artifacts"
LOCK_WORKER = TESTS / "support" / "lock_worker.py"

# What the page drew: every bar and the notes next to it, the lock line, the pending writes.
DRAWN = """(() => {
  const section = document.querySelector('section.table[data-table="orders"]');
  if (!section) return null;
  const lock = section.querySelector('.lock');
  return {
    bars: [...section.querySelectorAll('.bar')].map((bar) => {
      const box = bar.getBoundingClientRect();
      return {instant: bar.dataset.instant, action: bar.dataset.action, state: bar.dataset.state,
              marks: bar.dataset.marks ? bar.dataset.marks.split(' ').sort() : [],
              undoes: bar.dataset.undoes || null, rolledBackBy: bar.dataset.rolledBackBy || null,
              notes: bar.closest('.row').querySelector('.notes').textContent,
              left: box.left, right: box.right};
    }),
    holder: lock && lock.dataset.holder, lockInstant: lock && lock.dataset.instant,
    lockText: lock && lock.textContent,
    stale: [...section.querySelectorAll('.heartbeat.stale')].map((h) => h.dataset.instant),
    legend: document.querySelectorAll('#legend .key').length,
    refreshes: Number(document.body.dataset.refreshes || 0),
  };
})()"""


def group(partition: str, key: str, value: str = "v", ts: int = 1) -> list[dict[str, Any]]:
    return [{"partition": partition, "keys": [key], "value": value, "ts": ts}]


def released(processes: Processes, name: str) -> None:
    (processes.directory / f"{name}.go").touch()


def test_the_page_draws_writers_conflicts_rollbacks_the_lock_and_stale_heartbeats(
    tmp_path: Path, processes: Processes, capsys: pytest.CaptureFixture[str]
) -> None:
    # A heartbeat tolerance of 3 s: the machine may be busy (the browser starts while H holds the lock,
    # and a holder whose renewals that delays past the tolerance is expired), and a paused writer must
    # stay live.
    target = Target(str(tmp_path / "table"), interval_ms=500, misses=6)
    table = target.create()
    writer(target.table()).insert(rows(["k1"]))
    # The daemon gives up waiting for the table lock quickly, so its polls end while a holder keeps it.
    entry = TableEntry(target.uri, settings={**target.settings, keys.LOCK_WAIT_MS.key: "300"})

    with serving(entry, http=True) as daemon:
        port = port_of(daemon)

        # Two writers overlap: A writes, B writes and commits, then A commits.
        a = processes.writer(target, group("p1", "a1", "A"), "a", "written", release_by_file=True)
        a_time = processes.paused(a, "a")["instant"]
        b_time = writer(target.table()).insert(rows(["b1"], part="p2")).requested_time  # type: ignore[union-attr]
        time.sleep(0.5)  # so that A's bar is drawn wider than B's, whose minimum width is 3 pixels
        released(processes, "a")
        assert a.wait(30) == 0, processes.stderr("a")

        # C loses a conflict on k1's file group to D, gives up, and the daemon rolls it back.
        c = processes.writer(target, group("p0", "k1", "C", 2), "c", "written", release_by_file=True)
        c_time = processes.paused(c, "c")["instant"]
        writer(target.table()).upsert(rows(["k1"], ts=3, value="D"))
        released(processes, "c")
        assert c.wait(30) == EXIT_CONFLICT, processes.stderr("c")
        wait_until(lambda: count(daemon, "cowrite_rollbacks_total", table="orders") == 1, "C's rollback")

        # E dies mid-write: its heartbeat goes stale and the daemon rolls it back.
        e = processes.writer(target, group("p3", "e1"), "e", "written")
        e_time = processes.paused(e, "e")["instant"]
        kill(e)
        wait_until(lambda: count(daemon, "cowrite_rollbacks_total", table="orders") == 2, "E's rollback")

        # G stays pending and alive; F dies while H holds the table lock, so F cannot be rolled back.
        g = processes.writer(target, group("p4", "g1"), "g", "written", release_by_file=True)
        g_time = processes.paused(g, "g")["instant"]
        f = processes.writer(target, group("p5", "f1"), "f", "written")
        f_time = processes.paused(f, "f")["instant"]
        h_time = from_millis(int(time.time() * 1000))
        spec = {
            "uri": target.uri,
            "instant": h_time,
            "config": {keys.LOCK_PROVIDER.key: "filesystem"},
            "heartbeat": [target.interval_ms / 1000, target.misses],
        }
        holder = processes.start([sys.executable, str(LOCK_WORKER), "hold", json.dumps(spec)], {}, "h")

        def held_by_h() -> str | None:
            lock = current_lock(table.storage)
            return lock.holder.owner if lock and lock.holder and lock.holder.instant == h_time else None

        owner = wait_until(held_by_h, "H to take the lock")
        # F dies once it has beaten: what goes stale is a heartbeat, not a writer that never had one
        wait_until(lambda: table.storage.exists(heartbeat_path(f_time)), "F's first heartbeat")
        kill(f)
        wait_until(lambda: count(daemon, "cowrite_failed_writes", table="orders") == 1, "F judged failed")
        polls_later(daemon, 1)
        status, heartbeats = get(port, "/api/tables/orders/heartbeats")
        assert status == 200
        assert {h["instant"]: h["stale"] for h in heartbeats} == {g_time: False, f_time: True}

        with Chromium(tmp_path / "browser") as browser:
            browser.open(f"http://127.0.0.1:{port}/?refresh=500")
            drawn = browser.wait_for(
                f"(() => {{ const d = {DRAWN}; return d && d.stale.length && d.holder ? d : null; }})()",
                "the page to draw the table",
            )
            shot = browser.screenshot(ARTIFACTS / "daemon-page.png")
            with capsys.disabled():
                print(f"\nscreenshot of the daemon's page: {shot}")
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

            bars = {bar["instant"]: bar for bar in drawn["bars"]}
            for instant in (a_time, b_time):  # committed, unmarked
                assert (bars[instant]["action"], bars[instant]["state"]) == ("commit", "COMPLETED")
                assert bars[instant]["marks"] == []
            # A was requested before B and completed after it: its bar spans B's
            assert (
                bars[a_time]["left"] < bars[b_time]["left"] and bars[a_time]["right"] > bars[b_time]["right"]
            )
            assert bars[c_time]["state"] == "ROLLED_BACK"
            assert bars[c_time]["marks"] == ["conflict", "rolled-back"]
            assert bars[e_time]["state"] == "ROLLED_BACK"
            assert bars[e_time]["marks"] == ["rolled-back"]
            rollbacks = [bar for bar in drawn["bars"] if bar["action"] == "rollback"]
            assert sorted(bar["undoes"] for bar in rollbacks) == sorted([c_time, e_time])
            assert {bars[c_time]["rolledBackBy"], bars[e_time]["rolledBackBy"]} == {
                bar["instant"] for bar in rollbacks
            }
            assert all(bar["notes"].startswith("undoes ") for bar in rollbacks)
            assert bars[g_time]["marks"] == ["pending"]
            assert bars[f_time]["marks"] == ["failed", "pending", "stale"]
            assert "stale heartbeat" in bars[f_time]["notes"]  # the mark's words
            assert (drawn["holder"], drawn["lockInstant"]) == (owner, h_time)
            assert drawn["stale"] == [f_time]
            assert drawn["legend"] >= 9
            assert [b for b in drawn["bars"] if b["action"] == "commit" and not b["marks"]] != []

            # H dies: the daemon expires its lock and rolls F back; the page redraws without a reload.
            before = drawn["refreshes"]
            kill(holder)
            after = browser.wait_for(
                f"""(() => {{ const d = {DRAWN};
                     const f = d && d.bars.find((b) => b.instant === "{f_time}");
                     const done = f && f.state === "ROLLED_BACK" && !d.holder && !d.stale.length;
                     return done ? d : null; }})()""",
                "the page to show F rolled back and the lock free",
            )
            assert after["refreshes"] > before
            assert "free" in after["lockText"]
            browser.screenshot(ARTIFACTS / "daemon-page-after.png")
            assert browser.errors == []
        released(processes, "g")
        assert g.wait(30) == 0, processes.stderr("g")


def test_the_page_and_its_files_are_served_from_the_package_only(tmp_path: Path) -> None:
    target = Target(str(tmp_path / "table"))
    target.create()
    with serving(target.entry(), http=True) as daemon:
        port = port_of(daemon)
        for path, kind in [
            ("/", "text/html"),
            ("/page/page.js", "text/javascript"),
            ("/page/page.css", "text/css"),
        ]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
                assert response.headers["Content-Type"].startswith(kind)
                assert response.headers["Content-Security-Policy"].startswith("default-src 'self'")
                body = response.read().decode()
            assert "http://" not in body and "https://" not in body  # nothing fetched from elsewhere
        assert get(port, "/page/../http.py")[0] == 404
        assert get(port, "/page/secret.txt")[0] == 404
        assert get(port, "/api/tables/nope/recent") == (
            404,
            {"error": "no table named 'nope' is served here"},
        )
        status, body = get(port, "/api/tables/orders/recent?limit=x")
        assert status == 400 and "limit" in body["error"]
