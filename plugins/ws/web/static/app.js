// tether browser terminal: xterm.js on GET /api/pty (docs/PROTOCOL.md).
// Plain JavaScript, no build step; the package doc of plugins/ws/web
// describes the behaviour, the states and the choices made here.
(function () {
  "use strict";

  // ---- constants

  const ATTACH_KEY = "tether.attach"; // localStorage: the current terminal's attach token (what a new tab opens)
  const TERMINALS_KEY = "tether.terminals"; // localStorage: this browser's terminals, a JSON array
  const TAB_KEY = "tether.tab.attach"; // sessionStorage: this tab's terminal, so a reload keeps it
  const FONT_KEY = "tether.fontSize"; // localStorage
  const COPY_KEY = "tether.copyOnSelect"; // localStorage: "1" or "0"
  const OLD_ACCESS_KEY = "tether.access"; // sessionStorage of older pages: the access token, now removed
  const OLD_CURSOR_PREFIX = "tether.cursor."; // sessionStorage of older pages: a cursor per token, now unused
  const ATTACH_RE = /^[A-Za-z0-9_-]{16,128}$/;

  const BACKOFF_FIRST_MS = 250; // the bound of the first retry's delay doubles per failed attempt...
  const BACKOFF_MAX_MS = 10000; // ...up to this, forever (see backoffDelay)
  const RETRY_LOG = 64; // retries kept for window.tether
  const DIAL_TIMEOUT_MS = 10000; // from new WebSocket to the pty.replay header
  const EXIT_WAIT_MS = 5000; // "Type exit and close": how long to wait for the shell to end
  const FONT_DEFAULT = 14;
  const FONT_MIN = 8;
  const FONT_MAX = 32;
  const LINE_HEIGHT = 1.1; // xterm.js lineHeight: cell height over the font's (see new Terminal)
  // Flow control: the browser takes every frame at once, xterm.js parses
  // them later. When more than HIGH bytes wait to be parsed, the page
  // detaches and reattaches from its offset once xterm.js is below LOW, so
  // the output waits in the server's ring instead of in this tab's memory.
  const QUEUE_HIGH = 8 << 20;
  const QUEUE_LOW = 512 << 10;

  // A RESET cancels any escape sequence a dropped stream left open (CAN)
  // and resets the terminal (RIS); EMPTY carries only a write callback.
  const RESET = new Uint8Array([0x18, 0x1b, 0x63]);
  const EMPTY = new Uint8Array(0);

  // What a close code means, as the page says it.
  const CLOSE_TEXT = {
    1000: "closed",
    1001: "host restarting",
    1002: "protocol error",
    1005: "closed without a code",
    1006: "connection lost",
    1007: "invalid data",
    1008: "refused by policy",
    1009: "message too big",
    1011: "host error",
    1012: "terminal service restarting",
    1013: "too slow to keep up",
    1015: "TLS handshake failed",
    4400: "bad attach token",
    4401: "access token missing or wrong",
    4403: "forbidden origin or host",
    4404: "terminal endpoint switched off",
    4408: "this host only accepts local connections",
    4409: "taken over by another client (a tab, a window or tether attach)",
    4410: "session ended",
    4411: "no such terminal",
  };

  // Closes after which the page does not retry by itself: what to tell the
  // user, and whether Reconnect is offered. Any other close (1001, 1006,
  // 1012, 1013, 1011 other than "registry full", ...) is retried forever.
  const FATAL = {
    4400: ["The attach token is malformed. Start a New terminal.", false],
    4401: ["Open the URL printed by tether serve (its token is in <state-dir>/token); this page's cookie does not carry the host's access token.", false],
    4403: ["Open the URL printed by tether serve: the host refuses this page's origin or host name.", false],
    4404: ["The terminal endpoint is switched off on this host.", true],
    4408: ["The host only accepts connections from its own machine.", false],
    4411: ["The host has no such terminal.", true],
  };
  const REGISTRY_FULL = "Too many terminals are open on the host (--pty-max-sessions). Close one (exit its shell) and Reconnect.";

  const $ = (id) => document.getElementById(id);
  const body = document.body;
  const statusText = $("status-text");
  const toastEl = $("toast");
  const overlayTitle = $("overlay-title");
  const overlayText = $("overlay-text");
  const reconnectButton = $("reconnect");
  const restartButton = $("restart");
  const overlayClose = $("overlay-close");
  const newButton = $("new-terminal");

  // ---- storage (may be unavailable; then values live for this page only)

  function storage(name) {
    try {
      return window[name];
    } catch (_) {
      return null;
    }
  }
  const session = storage("sessionStorage");
  const local = storage("localStorage");

  function load(s, key) {
    try {
      return s ? s.getItem(key) : null;
    } catch (_) {
      return null;
    }
  }
  function save(s, key, value) {
    try {
      if (s) s.setItem(key, value);
    } catch (_) {
      // quota or privacy mode: keep going without persistence
    }
  }
  function drop(s, key) {
    try {
      if (s) s.removeItem(key);
    } catch (_) {
      // as above
    }
  }

  drop(session, OLD_ACCESS_KEY);
  try {
    for (let i = session ? session.length - 1 : -1; i >= 0; i--) {
      const k = session.key(i);
      if (k && k.startsWith(OLD_CURSOR_PREFIX)) session.removeItem(k);
    }
  } catch (_) {
    // as above
  }

  // ---- tokens

  // takeURLParams removes ?token= and ?attach= from the visible URL (and
  // so from the history) and returns ?attach=. The page never reads the
  // access token: the host answered this page because the request
  // carried a credential, and signed the browser in with the HttpOnly
  // page cookie (tether_PORT), which the browser sends with every
  // request of this origin, the WebSocket upgrades included.
  // A share link's ?view=1 (tether share pty TOKEN --view) makes this
  // tab a viewer of its terminal: it attaches with view=1, sends no
  // input or size, and says so on screen; kept for the tab's reloads.
  const VIEW_KEY = "tether.view";
  let viewOnly = false;
  function takeURLParams() {
    const url = new URL(location.href);
    const token = url.searchParams.get("token");
    const attachParam = url.searchParams.get("attach");
    if (url.searchParams.get("view") === "1" && attachParam !== null) {
      viewOnly = true;
      try {
        sessionStorage.setItem(VIEW_KEY, attachParam);
      } catch (_) {
        // no storage: read-only until a reload
      }
    }
    url.searchParams.delete("view");
    if (token === null && attachParam === null) return null;
    url.searchParams.delete("token");
    url.searchParams.delete("attach");
    history.replaceState(history.state, "", url.pathname + url.search + url.hash);
    return attachParam;
  }

  function newAttachToken() {
    const b = new Uint8Array(16);
    crypto.getRandomValues(b);
    let s = "";
    for (const x of b) s += String.fromCharCode(x);
    return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function valid(t) {
    return typeof t === "string" && ATTACH_RE.test(t) ? t : null;
  }

  // ---- this browser's terminals: [{token, n, created, used, title, epoch, ended}]

  function loadTerminals() {
    try {
      const v = JSON.parse(load(local, TERMINALS_KEY) || "[]");
      return Array.isArray(v) ? v.filter((e) => e && valid(e.token)) : [];
    } catch (_) {
      return [];
    }
  }

  // updateTerminal merges fields into the entry of token, adding it if
  // it is missing; it re-reads the list first, as other tabs change it.
  function updateTerminal(token, fields) {
    const list = loadTerminals();
    let e = list.find((x) => x.token === token);
    if (!e) {
      const n = list.reduce((m, x) => Math.max(m, Number(x.n) || 0), 0) + 1;
      e = { token, n, created: Date.now() };
      list.push(e);
    }
    Object.assign(e, fields);
    save(local, TERMINALS_KEY, JSON.stringify(list));
    renderTerminals();
    return e;
  }

  function removeTerminal(token) {
    save(local, TERMINALS_KEY, JSON.stringify(loadTerminals().filter((x) => x.token !== token)));
    renderTerminals();
  }

  function terminalName(e) {
    if (!e) return "this terminal";
    return e.title ? e.title : "Terminal " + (e.n || "?");
  }

  let attach = valid(takeURLParams()) || valid(load(session, TAB_KEY)) || valid(load(local, ATTACH_KEY));
  try {
    if (!viewOnly && attach !== null && sessionStorage.getItem(VIEW_KEY) === attach) viewOnly = true;
  } catch (_) {
    // no storage
  }
  if (attach === null) {
    const list = loadTerminals().sort((a, b) => (b.used || 0) - (a.used || 0));
    attach = list.length ? list[0].token : newAttachToken();
  }

  // makeCurrent records token as this tab's terminal and the browser's
  // current one (the one a new tab opens).
  function makeCurrent(token) {
    attach = token;
    save(session, TAB_KEY, token);
    save(local, ATTACH_KEY, token);
    updateTerminal(token, { used: Date.now() });
  }

  // ---- state shown to the user and to tests

  let state = "";
  let overlayKind = "";
  function setState(next, status, overlay) {
    state = next;
    body.dataset.state = next;
    body.dataset.readonly = viewOnly ? "1" : "";
    statusText.textContent = viewOnly && next === "connected" ? status + " · read-only: you watch, typing sends nothing" : status;
    const o = overlay || {};
    overlayKind = next;
    overlayTitle.textContent = o.title || "";
    overlayText.textContent = o.text || "";
    reconnectButton.hidden = !o.reconnect;
    if (o.reconnect) reconnectButton.textContent = o.reconnect;
    restartButton.hidden = !o.restart;
    overlayClose.hidden = !o.close;
    // An ended terminal has no shell left: closing it only forgets it.
    overlayClose.textContent = next === "ended" ? "Close this terminal" : "Close this terminal…";
    $("overlay").setAttribute("aria-hidden", next === "connected" ? "true" : "false");
    if (term) {
      const blocked = next !== "connected" || viewOnly;
      if (term.options.disableStdin !== blocked) term.options.disableStdin = blocked;
    }
  }

  let toastTimer = 0;
  function toast(text, ms) {
    clearTimeout(toastTimer);
    toastEl.textContent = text;
    toastEl.classList.add("on");
    toastTimer = setTimeout(() => {
      toastEl.classList.remove("on");
      toastEl.textContent = "";
    }, ms || 2500);
  }

  let term = null;
  if (typeof Terminal !== "function" || typeof FitAddon !== "object" || typeof WebLinksAddon !== "object" || typeof SearchAddon !== "object") {
    setState("error", "failed to load xterm.js", { title: "The page did not load", text: "xterm.js or one of its addons is missing." });
    return;
  }

  // ---- the terminal

  function clampFont(n) {
    n = Math.round(Number(n));
    return n >= FONT_MIN && n <= FONT_MAX ? n : FONT_DEFAULT;
  }

  term = new Terminal({
    allowProposedApi: true, // the search addon's match decorations
    cursorBlink: true,
    disableStdin: true, // until the first screen is restored
    fontFamily: 'ui-monospace, Menlo, Consolas, "DejaVu Sans Mono", "Liberation Mono", monospace',
    fontSize: clampFont(load(local, FONT_KEY) || FONT_DEFAULT),
    // xterm.js makes a cell exactly as tall as the font's ascent plus its
    // descent, which the browser rounds to whole pixels each, and its DOM
    // renderer clips every row to its cells. DejaVu Sans Mono (the usual
    // Linux monospace) draws "_" at the very bottom of its descent: at
    // 14 px the descent is 3.3 px, rounded to 3, and the underscore's one
    // pixel row is the 17th of a 16-pixel cell, so it vanished (also at
    // 10, 19 and 23 px). A tenth of leading (17-pixel cells at 14 px)
    // keeps it inside the cell at every size the page offers.
    lineHeight: LINE_HEIGHT,
    scrollback: 10000,
    theme: {
      background: "#1e1e1e",
      foreground: "#d4d4d4",
      cursor: "#d4d4d4",
      selectionBackground: "#264f78",
    },
  });
  const fitAddon = new FitAddon.FitAddon();
  const searchAddon = new SearchAddon.SearchAddon();
  term.loadAddon(fitAddon);
  term.loadAddon(searchAddon);
  term.loadAddon(
    new WebLinksAddon.WebLinksAddon(
      (_ev, uri) => {
        // The page's URL holds no secret, but the opened page gets no
        // handle on this one either way.
        window.open(uri, "_blank", "noopener,noreferrer");
      },
      {
        hover: (_ev, uri) => toast("click to open " + uri, 4000),
        leave: () => toast("", 1),
      },
    ),
  );
  term.open($("terminal"));
  term.onTitleChange((t) => {
    document.title = t ? t + " — tether" : "tether";
    const e = t ? loadTerminals().find((x) => x.token === attach) : null;
    if (t && (!e || e.title !== t)) updateTerminal(attach, { title: t });
  });

  // ---- the connection
  //
  // Replayed bytes (a snapshot, or a raw replay) are written to xterm.js
  // while the state is connecting or reconnecting, when disableStdin is on
  // and onData is not forwarded: what xterm.js answers to a query inside a
  // replay goes nowhere. The state turns connected in the write callback
  // of the last replayed byte, which xterm.js calls after parsing that
  // chunk and before parsing the next one, so the first live byte is
  // parsed with input on and a live query is answered.

  let ws = null; // the current socket; events of any other are ignored
  let gen = 0; // bumps on every connect; callbacks of an older one do nothing
  let header = null; // the current socket's pty.replay, with .remaining replay bytes to come
  let restoring = false; // a replay is being written: no fitting meanwhile
  let screenEpoch = null; // epoch of the output on screen; null: no valid cursor
  let offset = 0; // offset of the next byte of screenEpoch
  let queued = 0; // bytes handed to term.write and not yet parsed
  let paused = false; // detached for flow control
  let dialTimer = 0;
  let attempt = 0; // failed attempts since the last restore
  let retryTimer = 0;
  let retryAt = 0;
  let pendingRetry = null; // {attempt, delay, bound, at} of the scheduled retry, for tests
  const retryLog = []; // the last RETRY_LOG retries scheduled, for tests
  let countdownTimer = 0;
  let outage = null; // {code, reason}: the close that started this outage
  let lastClose = null; // {code, reason}: the latest close
  let exitPending = null; // {token, timer}: "Type exit and close" is waiting for 4410

  function write(data, cb) {
    const n = data.length;
    queued += n;
    term.write(data, () => {
      queued -= n;
      if (cb) cb();
      if (paused && queued <= QUEUE_LOW) connect("reconnecting");
    });
  }

  function wsURL() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return scheme + "//" + location.host + "/api/pty";
  }

  function closeLabel(c) {
    if (!c) return "";
    let t = CLOSE_TEXT[c.code] || (c.code >= 4000 ? "closed by the host" : "closed");
    if (c.code === 4403 && /scope/.test(c.reason || "")) t = "outside this link's access";
    if (c.code === 4401 && /revoked|expired/.test(c.reason || "")) t = "this link's " + c.reason;
    if (c.code === 1011 && c.reason) t += ": " + c.reason;
    return t + " (" + c.code + ")";
  }

  function stopRetry() {
    clearTimeout(retryTimer);
    clearInterval(countdownTimer);
    retryTimer = 0;
    countdownTimer = 0;
    pendingRetry = null;
  }

  // connect replaces the current socket (if any) with a new one; with a
  // valid cursor it asks for the bytes from it, else for a snapshot.
  function connect(next) {
    stopRetry();
    clearTimeout(dialTimer);
    paused = false;
    closeCurrent("replaced");
    const g = ++gen;
    header = null;
    restoring = false;

    let q = "attach=" + encodeURIComponent(attach); // the access token goes in the cookie
    const cursor = screenEpoch !== null ? offset : null;
    if (cursor !== null) q += "&offset=" + cursor + "&epoch=" + encodeURIComponent(screenEpoch);
    if (viewOnly) q += "&view=1";
    // The size the window fits: the PTY takes it before the host draws a
    // snapshot, so the snapshot is of the screen at this size. The page
    // still fits and sends its size once the replay is written (a host
    // that ignores the query resizes then).
    const fit = viewOnly ? null : fitSize(); // a viewer never sizes the PTY
    if (fit) q += "&cols=" + fit.cols + "&rows=" + fit.rows;

    const why = outage ? closeLabel(outage) + " — " : "";
    setState(next, next === "reconnecting" ? why + "reconnecting…" : "connecting…", {
      title: next === "reconnecting" ? "Reconnecting…" : "Connecting…",
      text: next === "reconnecting" ? why + "input is blocked until the terminal is back." : "",
    });
    let sock;
    try {
      sock = new WebSocket(wsURL() + "?" + q);
    } catch (err) {
      setState("error", "cannot open a WebSocket: " + err.message, {
        title: "Cannot connect",
        text: String(err.message),
        reconnect: "Reconnect",
      });
      return;
    }
    sock.binaryType = "arraybuffer";
    ws = sock;
    dialTimer = setTimeout(() => {
      if (ws !== sock || header) return;
      closeCurrent("no answer");
      onClose({ code: 1006, reason: "no answer from the host", wasClean: false });
    }, DIAL_TIMEOUT_MS);
    sock.onmessage = (ev) => {
      if (ws !== sock) return;
      if (typeof ev.data === "string") {
        let msg = null;
        try {
          msg = JSON.parse(ev.data);
        } catch (_) {
          return;
        }
        if (msg && msg.type === "pty.replay" && header === null) onHeader(msg, cursor, g);
        return;
      }
      if (header !== null) onBytes(new Uint8Array(ev.data), g);
    };
    sock.onclose = (ev) => {
      if (ws !== sock) return;
      ws = null;
      onClose(ev);
    };
  }

  // closeCurrent closes the current socket on purpose: its events are ignored.
  function closeCurrent(reason) {
    const old = ws;
    ws = null;
    if (old) {
      try {
        old.close(1000, reason);
      } catch (_) {
        // already closed
      }
    }
  }

  function count(v) {
    const n = Number(v);
    return Number.isSafeInteger(n) && n >= 0 ? n : 0;
  }
  function size(v) {
    const n = Number(v);
    return Number.isInteger(n) && n >= 1 && n <= 10000 ? n : 0;
  }

  let lastReplay = null; // the last pty.replay header, for tests and debugging

  function onHeader(msg, cursor, g) {
    clearTimeout(dialTimer);
    lastReplay = msg;
    const epoch = String(msg.epoch);
    const end = count(msg.replay_end_offset);
    const h = { epoch, snapshot: msg.snapshot === true, remaining: 0, previous: screenEpoch };
    restoring = true;
    if (h.snapshot) {
      // A snapshot redraws the terminal on a fresh cols×rows terminal, so
      // the page resets xterm.js and gives it the snapshot's size while
      // it is written — the window's, which the page asked for, unless
      // the host could not give it; once written, the page fits the
      // window and resizes the PTY, and the program redraws for the new
      // size.
      h.remaining = count(msg.snapshot_bytes);
      const cols = size(msg.cols);
      const rows = size(msg.rows);
      screenEpoch = null; // no valid cursor until the whole snapshot is here
      offset = end;
      write(RESET, () => {
        if (cols && rows && (cols !== term.cols || rows !== term.rows)) term.resize(cols, rows);
      });
    } else if (msg.reset || cursor === null) {
      // A raw replay of the whole ring (a backend without snapshots).
      const start = count(msg.start_offset);
      h.remaining = Math.max(0, end - start);
      screenEpoch = epoch;
      offset = start;
      write(RESET);
    } else {
      h.remaining = Math.max(0, end - cursor);
      screenEpoch = epoch;
      offset = cursor;
    }
    header = h;
    statusText.textContent = "restoring the screen…";
    if (h.remaining === 0) replayDone(g);
  }

  function onBytes(bytes, g) {
    let live = bytes;
    if (header.remaining > 0) {
      const k = Math.min(header.remaining, bytes.length);
      header.remaining -= k;
      if (!header.snapshot) offset += k; // snapshot bytes are not PTY output
      write(bytes.subarray(0, k));
      live = bytes.subarray(k);
      if (header.remaining === 0) replayDone(g);
    }
    if (live.length > 0) {
      offset += live.length;
      write(live);
    }
    if (queued > QUEUE_HIGH && !paused && !restoring && screenEpoch !== null) {
      closeCurrent("catching up");
      paused = true;
      setState("reconnecting", "catching up with the output…", {
        title: "Catching up…",
        text: "The output comes faster than this tab can draw it; the rest waits on the host.",
      });
    }
  }

  // replayDone runs once every replay byte has been received: after
  // xterm.js parsed them, the page fits, sends its size and takes input.
  function replayDone(g) {
    const h = header;
    if (h.snapshot) screenEpoch = h.epoch;
    write(EMPTY, () => {
      if (g !== gen || !ws) return;
      restoring = false;
      const e = loadTerminals().find((x) => x.token === attach);
      const known = h.previous || (e && e.epoch) || null;
      updateTerminal(attach, { epoch: h.epoch, used: Date.now(), ended: false });
      attempt = 0;
      outage = null;
      fitTerminal();
      sendSize();
      let text = "connected";
      if (known !== null && known !== h.epoch) text += " — a new shell (the previous one had ended)";
      setState("connected", text);
      if (!document.hidden && !dialogOpen() && terminalShown()) term.focus();
    });
  }

  function onClose(ev) {
    clearTimeout(dialTimer);
    const c = { code: ev.code, reason: ev.reason || "" };
    body.dataset.closeCode = String(c.code);
    lastClose = c;
    const wasRestoring = restoring;
    header = null;
    restoring = false;
    if (wasRestoring) fitTerminal();
    if (c.code === 4409) {
      setState("superseded", "taken over by another client: a tab, a window or tether attach (4409) — input blocked here", {
        title: "Taken over by another client",
        text: "Another tab or window took this terminal (4409). This tab stays as it was and sends nothing; Take it back makes it the terminal's writer again.",
        reconnect: "Take it back",
      });
      return;
    }
    if (c.code === 4410) {
      screenEpoch = null; // the next attach starts a new shell
      updateTerminal(attach, { ended: true });
      if (exitPending && exitPending.token === attach) {
        const token = attach;
        clearTimeout(exitPending.timer);
        exitPending = null;
        forget(token);
        toast("the shell ended; its terminal is closed", 4000);
        return;
      }
      setState("ended", "session ended (4410)", {
        title: "Session ended",
        text: "The shell of this terminal exited (4410).",
        restart: true,
        close: true,
      });
      return;
    }
    let fatal = FATAL[c.code] || (c.code === 1011 && /registry full/.test(c.reason) ? [REGISTRY_FULL, true] : null);
    if (c.code === 4403 && /scope/.test(c.reason || "")) fatal = ["The link this page was opened with does not reach this terminal (or only to watch it). Ask its owner for a new link.", false];
    if (c.code === 4401 && /revoked|expired/.test(c.reason || "")) fatal = ["The link this page was opened with was " + (/expired/.test(c.reason) ? "expired" : "revoked") + " by its owner.", false];
    if (fatal) {
      setState("error", closeLabel(c), { title: closeLabel(c), text: fatal[0], reconnect: fatal[1] ? "Reconnect" : "" });
      return;
    }
    retry(c);
  }

  // backoffBound is the bound of the delay before the retry that follows
  // attempt failed attempts: BACKOFF_FIRST_MS doubling, at most
  // BACKOFF_MAX_MS.
  function backoffBound(attempt) {
    return Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * Math.pow(2, attempt));
  }
  // backoffDelay is that delay for r drawn uniformly from [0, 1): "full
  // jitter", uniform in [0, bound), so the tabs a host restart dropped
  // all at once come back spread over the whole window, not together.
  function backoffDelay(attempt, r) {
    return Math.floor(r * backoffBound(attempt));
  }

  // retry schedules the next attempt on a doubling, capped, fully
  // jittered backoff, with a countdown to the moment it is made; it
  // never gives up.
  function retry(c) {
    if (!outage) outage = c;
    const bound = backoffBound(attempt);
    const delay = backoffDelay(attempt, Math.random());
    attempt++;
    retryAt = Date.now() + delay;
    pendingRetry = { attempt, delay, bound, at: retryAt };
    retryLog.push(pendingRetry);
    if (retryLog.length > RETRY_LOG) retryLog.shift();
    retryTimer = setTimeout(() => connect("reconnecting"), delay);
    showCountdown();
    countdownTimer = setInterval(showCountdown, 250);
  }

  function showCountdown() {
    const left = Math.max(0, retryAt - Date.now());
    const when = left >= 1000 ? "reconnecting in " + Math.ceil(left / 1000) + " s" : "reconnecting…";
    const cause = closeLabel(outage);
    let detail = cause;
    if (lastClose && outage && lastClose.code !== outage.code) detail += "; last try: " + closeLabel(lastClose);
    if (attempt > 1) detail += "; attempt " + attempt;
    const text = cause + " — " + when;
    if (state === "reconnecting" && statusText.textContent === text) return;
    setState("reconnecting", text, {
      title: when.charAt(0).toUpperCase() + when.slice(1),
      text: detail + ". Input is blocked until the terminal is back.",
      reconnect: "Reconnect now",
    });
  }

  function retryNow() {
    if (retryTimer) connect("reconnecting");
  }

  // switchTo shows the terminal of token in this tab.
  function switchTo(token) {
    closeMenu();
    if (token === attach) {
      if (state !== "connected") {
        attempt = 0;
        connect("connecting");
      }
      return;
    }
    makeCurrent(token);
    screenEpoch = null;
    offset = 0;
    attempt = 0;
    outage = null;
    write(RESET);
    document.title = "tether";
    connect("connecting");
  }

  function newTerminal() {
    const token = newAttachToken();
    updateTerminal(token, { created: Date.now() });
    switchTo(token);
  }

  // forget drops token from this browser's list (after the user asked);
  // if it is this tab's terminal, the tab moves to the most recently used
  // other one, or to a new one.
  function forget(token) {
    removeTerminal(token);
    if (token !== attach) return;
    const rest = loadTerminals().sort((a, b) => (b.used || 0) - (a.used || 0));
    const next = rest.find((x) => !x.ended) || rest[0];
    if (next) switchTo(next.token);
    else newTerminal();
  }

  // ---- input and size

  const encoder = new TextEncoder();
  function writing() {
    return !viewOnly && state === "connected" && ws !== null && ws.readyState === WebSocket.OPEN;
  }
  function send(bytes) {
    if (writing()) ws.send(bytes);
  }
  term.onData((d) => send(encoder.encode(d)));
  term.onBinary((d) => {
    const b = new Uint8Array(d.length);
    for (let i = 0; i < d.length; i++) b[i] = d.charCodeAt(i) & 0xff;
    send(b);
  });

  function fitTerminal() {
    if (restoring) return; // replayDone fits
    try {
      fitAddon.fit();
    } catch (_) {
      // not laid out yet
    }
  }
  // fitSize is the size fitTerminal would give the terminal, or null
  // when the page is not laid out (a hidden terminal).
  function fitSize() {
    try {
      const d = fitAddon.proposeDimensions();
      if (d && Number.isInteger(d.cols) && Number.isInteger(d.rows) && d.cols >= 1 && d.rows >= 1) return d;
    } catch (_) {
      // not laid out yet
    }
    return null;
  }
  function sendSize() {
    if (!viewOnly && !restoring && ws && ws.readyState === WebSocket.OPEN && header !== null) {
      ws.send("\x1b[RESIZE:" + term.cols + ";" + term.rows + "]");
    }
  }
  let fitFrame = 0;
  function scheduleFit() {
    if (!fitFrame) {
      fitFrame = requestAnimationFrame(() => {
        fitFrame = 0;
        if (restoring) return;
        const before = term.cols + "x" + term.rows;
        fitTerminal();
        if (term.cols + "x" + term.rows !== before) sendSize();
      });
    }
  }
  window.addEventListener("resize", scheduleFit);
  if (typeof ResizeObserver === "function") {
    new ResizeObserver(scheduleFit).observe($("terminal"));
  }

  // ---- copy, search, font size

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).then(
        () => true,
        () => copyFallback(text),
      );
    }
    return Promise.resolve(copyFallback(text));
  }
  function copyFallback(text) {
    const ta = document.createElement("textarea");
    ta.value = text;
    ta.setAttribute("readonly", "");
    ta.className = "offscreen";
    document.body.appendChild(ta);
    ta.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch (_) {
      ok = false;
    }
    ta.remove();
    return ok;
  }
  function copySelection(auto) {
    const text = term.getSelection();
    if (!text) {
      if (!auto) toast("nothing selected");
      return;
    }
    copyText(text).then((ok) => {
      toast(ok ? "copied " + text.length + " characters" : "the browser refused the clipboard");
    });
    if (!auto) term.focus();
  }

  const copyOnSelect = $("copy-on-select");
  copyOnSelect.checked = load(local, COPY_KEY) === "1";
  copyOnSelect.addEventListener("change", () => {
    save(local, COPY_KEY, copyOnSelect.checked ? "1" : "0");
    term.focus();
  });
  // A selection is final when the mouse button goes up (also a user
  // gesture, which clipboard writes may need).
  $("terminal").addEventListener("mouseup", () => {
    if (copyOnSelect.checked) setTimeout(() => term.hasSelection() && copySelection(true), 0);
  });

  const searchBox = $("search");
  const searchInput = $("search-input");
  const searchCount = $("search-count");
  const searchOptions = {
    decorations: {
      matchBackground: "#5a4a1a",
      matchBorder: "#8a7432",
      matchOverviewRuler: "#d7ba7d",
      activeMatchBackground: "#a0781e",
      activeMatchBorder: "#ffd75f",
      activeMatchColorOverviewRuler: "#ffd75f",
    },
  };
  searchAddon.onDidChangeResults(({ resultIndex, resultCount }) => {
    if (!searchInput.value) searchCount.textContent = "";
    else if (resultCount === 0) searchCount.textContent = "no matches";
    else if (resultIndex < 0) searchCount.textContent = resultCount + "+ matches";
    else searchCount.textContent = resultIndex + 1 + " of " + resultCount;
  });
  function openSearch() {
    searchBox.hidden = false;
    const sel = term.getSelection();
    if (sel && !sel.includes("\n")) searchInput.value = sel;
    searchInput.select();
    searchInput.focus();
    if (searchInput.value) find(true);
  }
  function closeSearch() {
    searchBox.hidden = true;
    searchAddon.clearDecorations();
    searchCount.textContent = "";
    term.focus();
  }
  function find(forward, incremental) {
    const q = searchInput.value;
    if (!q) {
      searchAddon.clearDecorations();
      searchCount.textContent = "";
      return;
    }
    const o = Object.assign({ incremental: !!incremental }, searchOptions);
    if (forward) searchAddon.findNext(q, o);
    else searchAddon.findPrevious(q, o);
  }
  searchInput.addEventListener("input", () => find(true, true));
  searchInput.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") {
      ev.preventDefault();
      find(!ev.shiftKey);
    } else if (ev.key === "Escape") {
      ev.preventDefault();
      closeSearch();
    }
  });
  $("search-next").addEventListener("click", () => find(true));
  $("search-prev").addEventListener("click", () => find(false));
  $("search-close").addEventListener("click", closeSearch);

  const fontSizeButton = $("font-size");
  function setFont(n) {
    n = clampFont(n);
    fontSizeButton.textContent = String(n);
    save(local, FONT_KEY, String(n));
    if (term.options.fontSize !== n) {
      term.options.fontSize = n;
      scheduleFit();
    }
  }
  setFont(term.options.fontSize);
  $("font-up").addEventListener("click", () => setFont(Math.min(FONT_MAX, term.options.fontSize + 1)));
  $("font-down").addEventListener("click", () => setFont(Math.max(FONT_MIN, term.options.fontSize - 1)));
  fontSizeButton.addEventListener("click", () => setFont(FONT_DEFAULT));

  // shortcut names the page's own shortcut in a keyboard event, if any.
  function shortcut(ev) {
    if (!ev.ctrlKey || ev.altKey || ev.metaKey) return "";
    const k = ev.key.length === 1 ? ev.key.toLowerCase() : ev.key;
    if (ev.shiftKey && k === "c") return "copy";
    if (ev.shiftKey && k === "f") return "find";
    if (ev.shiftKey && k === "v") return "paste"; // the browser's own paste, not ^V
    if (k === "=" || k === "+") return "font-up";
    if (k === "-" && !ev.shiftKey) return "font-down";
    if (k === "0" && !ev.shiftKey) return "font-reset";
    return "";
  }
  function runShortcut(name) {
    switch (name) {
      case "copy":
        copySelection(false);
        break;
      case "find":
        openSearch();
        break;
      case "font-up":
        setFont(Math.min(FONT_MAX, term.options.fontSize + 1));
        break;
      case "font-down":
        setFont(Math.max(FONT_MIN, term.options.fontSize - 1));
        break;
      case "font-reset":
        setFont(FONT_DEFAULT);
        break;
    }
  }
  const MODIFIERS = new Set(["Shift", "Control", "Alt", "Meta", "AltGraph", "CapsLock"]);
  term.attachCustomKeyEventHandler((ev) => {
    const name = shortcut(ev);
    if (name) {
      if (ev.type === "keydown" && name !== "paste") {
        ev.preventDefault();
        runShortcut(name);
      }
      return false; // xterm.js leaves it alone
    }
    if (ev.type === "keydown" && state !== "connected" && !MODIFIERS.has(ev.key)) {
      // Say so instead of dropping keys silently.
      toast("not sent: " + (statusText.textContent || state), 3000);
      const card = document.querySelector("#overlay .card");
      card.classList.remove("nudge");
      void card.offsetWidth;
      card.classList.add("nudge");
    }
    return true;
  });
  // The same shortcuts when the focus is elsewhere on the page (the
  // terminal's own keys are handled above); not in the chat view, where
  // they are the browser's (Ctrl+= zooms).
  document.addEventListener("keydown", (ev) => {
    if (ev.defaultPrevented || (term.textarea && ev.target === term.textarea)) return;
    const name = terminalShown() ? shortcut(ev) : "";
    if (name && name !== "paste" && name !== "copy") {
      ev.preventDefault();
      runShortcut(name);
    } else if (ev.key === "Escape") {
      closeMenu();
    }
  });

  // ---- terminals menu and the close dialog

  const menu = $("terminals-menu");
  const menuButton = $("terminals");
  const listEl = $("terminals-list");

  function ago(ms) {
    const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
    if (s < 60) return "just now";
    if (s < 3600) return Math.round(s / 60) + " min ago";
    if (s < 86400) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " d ago";
  }

  function renderTerminals() {
    const list = loadTerminals().sort((a, b) => (a.created || 0) - (b.created || 0));
    $("terminals-count").textContent = String(list.length);
    listEl.textContent = "";
    for (const e of list) {
      const li = document.createElement("li");
      li.dataset.token = e.token;
      if (e.token === attach) li.className = "current";
      const pick = document.createElement("button");
      pick.type = "button";
      pick.className = "pick";
      pick.setAttribute("role", "menuitem");
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = terminalName(e);
      const meta = document.createElement("span");
      meta.className = "meta";
      const bits = ["started " + ago(e.created || Date.now())];
      if (e.token === attach) bits.unshift("this tab");
      if (e.ended) bits.push("shell ended");
      meta.textContent = bits.join(" · ");
      pick.append(name, meta);
      pick.title = "Show this terminal here (attach token " + e.token.slice(0, 6) + "…)";
      pick.addEventListener("click", () => switchTo(e.token));
      const x = document.createElement("button");
      x.type = "button";
      x.className = "close";
      x.title = "Close this terminal…";
      x.setAttribute("aria-label", "Close " + terminalName(e));
      x.textContent = "×";
      x.addEventListener("click", () => openClose(e.token));
      li.append(pick, x);
      listEl.append(li);
    }
  }

  function openMenu() {
    renderTerminals();
    menu.hidden = false;
    menuButton.setAttribute("aria-expanded", "true");
  }
  function closeMenu() {
    menu.hidden = true;
    menuButton.setAttribute("aria-expanded", "false");
  }
  menuButton.addEventListener("click", (ev) => {
    ev.stopPropagation();
    if (menu.hidden) openMenu();
    else closeMenu();
  });
  document.addEventListener("mousedown", (ev) => {
    if (!menu.hidden && !menu.contains(ev.target) && !menuButton.contains(ev.target)) closeMenu();
  });

  const dialog = $("close-dialog");
  let closing = null; // the token the dialog is about
  function dialogOpen() {
    return dialog.open === true;
  }
  function openClose(token) {
    closeMenu();
    const e = loadTerminals().find((x) => x.token === token) || { token };
    closing = token;
    $("close-name").textContent = terminalName(e);
    $("close-token").textContent = token;
    const canExit = token === attach && state === "connected";
    $("close-running").hidden = !!e.ended;
    $("close-token").parentElement.hidden = !!e.ended;
    $("close-exit-note").hidden = !canExit;
    $("close-exit").hidden = !canExit;
    if (typeof dialog.showModal === "function") dialog.showModal();
    else dialog.setAttribute("open", "");
  }
  function closeDialog() {
    closing = null;
    if (typeof dialog.close === "function") dialog.close();
    else dialog.removeAttribute("open");
    if (state === "connected") term.focus();
  }
  $("close-cancel").addEventListener("click", closeDialog);
  $("close-copy").addEventListener("click", () => {
    if (closing) copyText(closing).then((ok) => toast(ok ? "attach token copied" : "the browser refused the clipboard"));
  });
  $("close-forget").addEventListener("click", () => {
    const token = closing;
    closeDialog();
    if (token) forget(token);
  });
  $("close-exit").addEventListener("click", () => {
    const token = closing;
    closeDialog();
    if (token !== attach || !writing()) return;
    // End of line, kill the line, then exit: at a shell prompt this ends
    // the shell; 4410 then closes the terminal (onClose).
    send(encoder.encode("\x05\x15exit\r"));
    clearTimeout(exitPending && exitPending.timer);
    exitPending = {
      token,
      timer: setTimeout(() => {
        exitPending = null;
        toast("the shell did not exit (is a program running in it?) — the terminal stays open", 6000);
      }, EXIT_WAIT_MS),
    };
  });
  dialog.addEventListener("close", () => {
    closing = null;
  });

  // ---- the views (chat.js switches them): the terminal keeps its PTY
  // and its screen while the chat is shown, laid out but invisible, so
  // nothing is refitted on the way back.

  function terminalShown() {
    return body.dataset.view !== "chat";
  }
  document.addEventListener("tether:view", (ev) => {
    if (ev.detail.view === "chat") {
      closeMenu();
      if (!searchBox.hidden) {
        searchBox.hidden = true;
        searchAddon.clearDecorations();
        searchCount.textContent = "";
      }
      return;
    }
    scheduleFit();
    if (ev.detail.focus && state === "connected") term.focus();
  });

  // ---- buttons and page events

  reconnectButton.addEventListener("click", () => {
    attempt = 0;
    outage = null;
    connect("connecting");
  });
  restartButton.addEventListener("click", () => {
    attempt = 0;
    outage = null;
    connect("connecting"); // the same token: the host starts a new shell
  });
  overlayClose.addEventListener("click", () => {
    if (state === "ended") forget(attach);
    else openClose(attach);
  });
  newButton.addEventListener("click", newTerminal);
  $("find").addEventListener("click", openSearch);
  $("copy").addEventListener("click", () => copySelection(false));

  window.addEventListener("online", retryNow);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) retryNow();
  });
  window.addEventListener("storage", (ev) => {
    if (ev.key !== TERMINALS_KEY) return;
    // Another tab forgot this tab's terminal: it is still shown here.
    if (!loadTerminals().some((x) => x.token === attach)) updateTerminal(attach, { used: Date.now() });
    else renderTerminals();
  });

  window.tether = {
    term,
    state: () => state,
    offset: () => offset,
    epoch: () => screenEpoch,
    attach: () => attach,
    terminals: () => loadTerminals(),
    replay: () => lastReplay,
    retry: () => pendingRetry,
    retries: () => retryLog.slice(),
    backoffDelay,
  };

  makeCurrent(attach);
  fitTerminal();
  setState("connecting", "connecting…", { title: "Connecting…" });
  connect("connecting");
})();
