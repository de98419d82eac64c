// The daemon's page: polls the daemon's JSON API and draws each table's recent timeline as bars, one row
// per instant from its requested time to its completion (or to now while it is pending). Plain DOM, no
// dependencies, every request relative to the page so it works behind a path prefix. Text from the
// daemon only ever goes into textContent or attributes, never into markup.
"use strict";

(() => {
  const params = new URLSearchParams(location.search);
  const REFRESH_MS = Math.max(500, Number(params.get("refresh")) || 2000);
  const LIMIT = Math.min(500, Math.max(1, Number(params.get("limit")) || 60));
  const ACTIONS = new Set(["commit", "replacecommit", "clean", "rollback"]);
  const STEPS_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 10e3, 15e3, 30e3, 60e3, 120e3,
    300e3, 600e3, 900e3, 1800e3, 3600e3, 7200e3, 21600e3, 43200e3, 86400e3, 7 * 86400e3];

  // -- times: instants are yyyyMMddHHmmssSSS in UTC --------------------------------------------------
  function parseTime(t) {
    const n = (from, to) => Number(t.slice(from, to));
    return Date.UTC(n(0, 4), n(4, 6) - 1, n(6, 8), n(8, 10), n(10, 12), n(12, 14), n(14, 17));
  }
  const iso = (ms) => new Date(ms).toISOString();
  const clock = (ms, millis) => iso(ms).slice(11, millis ? 23 : 19);
  const fullTime = (ms) => `${iso(ms).slice(0, 10)} ${clock(ms, true)} UTC`;

  function duration(seconds) {
    if (seconds == null) return "–";
    if (seconds < 10) return `${seconds.toFixed(1)} s`;
    if (seconds < 120) return `${Math.round(seconds)} s`;
    if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
    return `${(seconds / 3600).toFixed(1)} h`;
  }

  // -- DOM -------------------------------------------------------------------------------------------
  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (value == null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "data") {
        for (const [name, v] of Object.entries(value)) if (v != null) node.dataset[name] = v;
      }
      else if (key === "style") Object.assign(node.style, value);
      else node.setAttribute(key, value);
    }
    for (const child of children.flat()) {
      if (child != null) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // -- the API ---------------------------------------------------------------------------------------
  async function getJSON(path) {
    const response = await fetch(path, { cache: "no-store" });
    const body = await response.json();
    if (!response.ok) throw new Error(body && body.error ? body.error : `${path}: HTTP ${response.status}`);
    return body;
  }

  async function load() {
    const tables = await getJSON("api/tables");
    return Promise.all(tables.map(async (status) => {
      if (!status.up) return { status };
      const base = `api/tables/${encodeURIComponent(status.name)}/`;
      try {
        const [recent, heartbeats, lock] = await Promise.all([
          getJSON(`${base}recent?limit=${LIMIT}`), getJSON(`${base}heartbeats`), getJSON(`${base}locks`),
        ]);
        return { status, recent, heartbeats, lock };
      } catch (error) {
        return { status, error: String(error.message || error) };
      }
    }));
  }

  // -- bars ------------------------------------------------------------------------------------------
  // One bar per instant on the timeline and per instant a rollback removed from it.
  function barsOf(recent, now) {
    const bars = recent.instants.map((i) => {
      const marks = [];
      const notes = [];
      const writer = i.writer;
      if (!i.completion_time) marks.push("pending");
      if (writer && writer.failed) marks.push("failed");
      if (writer && writer.stale) marks.push("stale");
      if (i.rolled_back_by) {
        marks.push("rolled-back");
        notes.push(`rolling back since ${clock(parseTime(i.rolled_back_by), true)}`);
      }
      if (i.aborted) marks.push(i.aborted === "conflict" ? "conflict" : "aborted");
      if (i.rollback_of) {
        notes.push(`undoes ${clock(parseTime(i.rollback_of.requested_time), true)} ${i.rollback_of.action}`);
      }
      return {
        time: i.requested_time, action: i.action, state: i.state, aborted: i.aborted, marks, notes,
        start: parseTime(i.requested_time), end: i.completion_time ? parseTime(i.completion_time) : now,
        ended: i.completion_time, undoes: i.rollback_of && i.rollback_of.requested_time,
        rolledBackBy: i.rolled_back_by, writer,
      };
    });
    for (const r of recent.rolled_back) {
      const marks = ["rolled-back"];
      if (r.aborted) marks.push(r.aborted === "conflict" ? "conflict" : "aborted");
      bars.push({
        time: r.requested_time, action: r.action, state: "ROLLED_BACK", aborted: r.aborted, marks,
        notes: [`rolled back at ${clock(parseTime(r.rolled_back_by), true)}`],
        start: parseTime(r.requested_time), end: parseTime(r.rolled_back_by), ended: null,
        undoes: null, rolledBackBy: r.rolled_back_by, writer: null,
      });
    }
    return bars.sort((a, b) => a.start - b.start || (a.time < b.time ? -1 : 1));
  }

  function ticks(from, to) {
    const step = STEPS_MS.find((s) => (to - from) / s <= 8) || STEPS_MS[STEPS_MS.length - 1];
    const found = [];
    for (let t = Math.ceil(from / step) * step; t <= to; t += step) found.push(t);
    return { step, found };
  }

  function drawChart(recent) {
    const now = parseTime(recent.now);
    const bars = barsOf(recent, now);
    if (!bars.length) return el("p", { class: "empty" }, "no instants yet");
    const first = Math.min(...bars.map((b) => b.start));
    const last = Math.max(now, ...bars.map((b) => b.end));
    const pad = Math.max(50, (last - first) * 0.02);
    const from = first - pad;
    const to = last + pad;
    const at = (ms) => `${((ms - from) / (to - from)) * 100}%`;
    const { step, found } = ticks(from, to);

    const axis = el("div", { class: "row axis" },
      el("div", { class: "label" }, `${iso(first).slice(0, 10)} (UTC)`),
      el("div", { class: "track" },
        found.map((t) => el("span", { class: "tick", style: { left: at(t) } }, clock(t, step < 1000))),
        el("span", { class: "now", style: { left: at(now) }, title: `now: ${fullTime(now)}` })),
      el("div", { class: "notes" }));

    const rows = bars.map((bar) => {
      const known = ACTIONS.has(bar.action) ? bar.action : "other";
      const title = [
        `${bar.time} ${bar.action} ${bar.state.toLowerCase().replace("_", " ")}`,
        `requested ${fullTime(bar.start)}`,
        bar.ended ? `completed ${fullTime(bar.end)}` : bar.state === "ROLLED_BACK" ? "" : "not completed",
        bar.aborted ? `its writer gave up: ${bar.aborted}` : "",
        bar.writer ? `last sign of life ${duration(bar.writer.idle_seconds)} before the daemon's last poll` : "",
        bar.undoes ? `undoes ${bar.undoes}` : "",
        bar.rolledBackBy ? `rolled back by ${bar.rolledBackBy}` : "",
      ].filter(Boolean).join("\n");
      return el("div", { class: "row", data: { instant: bar.time } },
        el("div", { class: "label", title },
          el("span", { class: "clock" }, clock(bar.start, true)), " ",
          el("span", { class: "action" }, bar.action)),
        el("div", { class: "track" },
          el("div", {
            class: ["bar", `action-${known}`, ...bar.marks].join(" "),
            data: {
              instant: bar.time, action: bar.action, state: bar.state, marks: bar.marks.join(" "),
              undoes: bar.undoes, rolledBackBy: bar.rolledBackBy,
            },
            style: { left: at(bar.start), width: `max(3px, ${at(from + bar.end - bar.start)})` },
            title,
          })),
        el("div", { class: "notes" },
          bar.marks.filter((m) => m !== "rolled-back" || bar.state === "ROLLED_BACK")
            .map((m) => el("span", { class: `mark ${m}` }, m === "stale" ? "stale heartbeat" : m.replace("-", " "))),
          bar.notes.map((n) => el("span", { class: "note" }, n))));
    });
    return el("div", { class: "chart" }, axis, rows);
  }

  // -- lock and heartbeats ---------------------------------------------------------------------------
  function drawLock(lock, now) {
    if (!lock || !lock.owner) {
      return el("div", { class: "lock free", data: { holder: "" } }, el("strong", {}, "Table lock: "), "free");
    }
    const since = lock.acquired_at != null
      ? ` since ${clock(lock.acquired_at * 1000, false)} (${duration(Math.max(0, now / 1000 - lock.acquired_at))})`
      : "";
    return el("div", { class: "lock held", data: { holder: lock.owner, instant: lock.instant || "" } },
      el("strong", {}, "Table lock: "), "held by ", el("code", { class: "holder" }, lock.owner),
      lock.instant ? [" for instant ", el("code", {}, lock.instant)] : " (no instant)", since);
  }

  function drawHeartbeats(heartbeats) {
    const items = heartbeats.map((h) => el("li", {
      class: ["heartbeat", h.stale ? "stale" : "", h.failed ? "failed" : ""].filter(Boolean).join(" "),
      data: { instant: h.instant },
    },
    el("code", {}, h.instant), ` ${h.action} ${h.state.toLowerCase()}: `,
    h.heartbeat_age_seconds == null ? `no heartbeat, idle ${duration(h.idle_seconds)}`
      : `heartbeat ${duration(h.heartbeat_age_seconds)} old`,
    h.stale ? el("span", { class: "mark stale" }, "stale heartbeat") : null,
    h.aborted ? el("span", { class: `mark ${h.aborted === "conflict" ? "conflict" : "aborted"}` }, h.aborted) : null,
    h.failed ? el("span", { class: "mark failed" }, "failed, awaiting rollback") : null));
    return el("div", { class: "heartbeats" }, el("strong", {}, "Pending writes: "),
      items.length ? el("ul", {}, items) : "none");
  }

  function drawTable(entry) {
    const s = entry.status;
    const health = s.up ? (entry.error ? "error" : "up") : "down";
    const section = el("section", { class: `table ${health}`, data: { table: s.name } },
      el("h2", {}, s.name, " ", el("span", { class: `health ${health}` }, health), " ",
        el("span", { class: "uri" }, s.uri)));
    if (!s.up || entry.error) {
      section.append(el("p", { class: "error" }, entry.error || s.error || "not polled yet"));
      return section;
    }
    const counts = Object.entries(s.instants).map(([state, n]) => `${n} ${state}`).join(", ");
    section.append(
      el("p", { class: "facts" }, `${counts || "no instants"} · ${s.pending} pending · ${s.failed} failed`,
        s.watermark ? ` · watermark ${s.watermark}` : ""),
      drawLock(entry.lock, parseTime(entry.recent.now)),
      drawHeartbeats(entry.heartbeats),
      drawChart(entry.recent));
    return section;
  }

  // -- the loop --------------------------------------------------------------------------------------
  let refreshes = 0;

  async function refresh() {
    const status = document.getElementById("status");
    try {
      const entries = await load();
      document.getElementById("tables").replaceChildren(...entries.map(drawTable));
      refreshes += 1;
      document.body.dataset.refreshes = String(refreshes);
      status.className = "";
      status.textContent = `${entries.length} table${entries.length === 1 ? "" : "s"} · updated `
        + `${clock(Date.now(), false)} UTC · refreshing every ${REFRESH_MS / 1000} s`;
    } catch (error) {
      status.className = "error";
      status.textContent = `the daemon did not answer (${error.message || error}); trying again`;
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }

  refresh();
})();
