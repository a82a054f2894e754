// tether browser terminal: one xterm.js terminal on GET /api/pty (docs/PROTOCOL.md).
// Plain JavaScript, no build step; the package doc of plugins/ws/web
// describes the behaviour and the states.
(function () {
  "use strict";

  const OLD_ACCESS_KEY = "tether.access"; // sessionStorage of older pages: the access token, now removed
  const ATTACH_KEY = "tether.attach"; // localStorage: the attach token
  const CURSOR_KEY = "tether.cursor."; // sessionStorage + attach token: {epoch, offset}
  const ATTACH_RE = /^[A-Za-z0-9_-]{16,128}$/;
  const BACKOFF_MS = [250, 500, 1000, 2000, 3000];
  const RETRY_CODES = new Set([1001, 1006, 1012, 1013]);
  const SAVE_DELAY_MS = 500;
  // Flow control: the browser takes every frame at once, xterm.js parses
  // them later. When more than HIGH bytes wait to be parsed, the page
  // detaches and reattaches from its offset once xterm.js is below LOW, so
  // the output waits in the server's ring instead of in this tab's memory.
  const QUEUE_HIGH = 8 << 20;
  const QUEUE_LOW = 512 << 10;

  // Closes that end the retries: the message, and whether Reconnect is offered.
  const FATAL = {
    1011: ["too many terminals open (registry full)", true],
    4400: ["bad attach token — use New terminal", false],
    4401: ["access token missing or wrong — open the URL printed by tether serve (its token is in <state-dir>/token)", false],
    4403: ["forbidden origin/host — open the URL printed by tether serve", false],
    4404: ["terminal endpoint switched off on this server", true],
    4408: ["this server only accepts local connections", false],
  };

  const body = document.body;
  const statusText = document.getElementById("status-text");
  const reconnectButton = document.getElementById("reconnect");
  const restartButton = document.getElementById("restart");
  const newButton = document.getElementById("new-terminal");

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

  // ---- tokens

  // takeURLParams removes ?token= and ?attach= from the visible URL (and
  // so from the history) and returns ?attach=. The page never reads the
  // access token: the server answered this page because the request
  // carried it, and keeps it in the HttpOnly cookie tether_token, which
  // the browser sends with every request of this origin, the WebSocket
  // upgrades included.
  function takeURLParams() {
    const url = new URL(location.href);
    const token = url.searchParams.get("token");
    const attachParam = url.searchParams.get("attach");
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

  drop(session, OLD_ACCESS_KEY);

  let attach = takeURLParams();
  if (attach === null || !ATTACH_RE.test(attach)) attach = load(local, ATTACH_KEY);
  if (attach === null || !ATTACH_RE.test(attach)) attach = newAttachToken();
  save(local, ATTACH_KEY, attach);

  // ---- state shown to the user and to tests

  let state = "";
  function setState(next, text, buttons) {
    state = next;
    body.dataset.state = next;
    statusText.textContent = text;
    reconnectButton.hidden = !(buttons && buttons.reconnect);
    restartButton.hidden = !(buttons && buttons.restart);
  }

  if (typeof Terminal !== "function" || typeof FitAddon !== "object") {
    setState("error", "failed to load xterm.js");
    return;
  }

  // ---- the terminal

  const term = new Terminal({
    cursorBlink: true,
    fontFamily: 'ui-monospace, Menlo, Consolas, "DejaVu Sans Mono", "Liberation Mono", monospace',
    fontSize: 14,
    scrollback: 10000,
    theme: { background: "#1e1e1e", foreground: "#d4d4d4" },
  });
  const fitAddon = new FitAddon.FitAddon();
  term.loadAddon(fitAddon);
  term.open(document.getElementById("terminal"));
  term.onTitleChange((t) => {
    document.title = t ? t + " — tether" : "tether";
  });

  // ---- the connection

  let ws = null; // the current socket; events of any other are ignored
  let attempt = 0; // next index into BACKOFF_MS
  let retryTimer = 0;
  let gaveUp = false; // the retries ran out
  let screenEpoch = null; // epoch of the PTY output on screen; null: empty screen
  let offset = 0; // bytes of screenEpoch received since the PTY started
  let queued = 0; // bytes handed to term.write and not yet parsed
  let paused = false; // detached for flow control
  let saveTimer = 0;

  // The cursor saved by an earlier page of this tab. Its screen is gone,
  // so only its epoch is used (with offset 0, which asks for the whole
  // window): it tells whether the terminal is still the same one.
  let savedEpoch = null;
  try {
    const c = JSON.parse(load(session, CURSOR_KEY + attach) || "null");
    if (c && typeof c.epoch === "string") savedEpoch = c.epoch;
  } catch (_) {
    // unreadable: start without
  }

  function saveCursor() {
    clearTimeout(saveTimer);
    saveTimer = 0;
    if (screenEpoch !== null) {
      save(session, CURSOR_KEY + attach, JSON.stringify({ epoch: screenEpoch, offset }));
    }
  }
  function scheduleSave() {
    if (!saveTimer) saveTimer = setTimeout(saveCursor, SAVE_DELAY_MS);
  }

  // resetScreen clears the terminal after anything still queued for it.
  function resetScreen() {
    if (queued > 0) term.write("\x1bc");
    else term.reset();
  }

  function wsURL() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return scheme + "//" + location.host + "/api/pty";
  }

  // connect replaces the current socket (if any) with a new one.
  function connect(next) {
    clearTimeout(retryTimer);
    retryTimer = 0;
    paused = false;
    gaveUp = false;
    closeCurrent("replaced");

    let q = "attach=" + encodeURIComponent(attach); // the access token goes in the cookie
    let requested = 0;
    if (screenEpoch !== null) {
      requested = offset;
      q += "&offset=" + offset + "&epoch=" + encodeURIComponent(screenEpoch);
    } else if (savedEpoch !== null) {
      q += "&offset=0&epoch=" + encodeURIComponent(savedEpoch);
    }

    setState(next, next === "reconnecting" ? "reconnecting…" : "connecting…");
    let sock;
    try {
      sock = new WebSocket(wsURL() + "?" + q);
    } catch (err) {
      setState("error", "cannot open a WebSocket: " + err.message, { reconnect: true });
      return;
    }
    sock.binaryType = "arraybuffer";
    ws = sock;
    sock.onopen = () => {
      if (ws === sock) fit();
    };
    sock.onmessage = (ev) => {
      if (ws !== sock) return;
      if (typeof ev.data === "string") {
        let msg = null;
        try {
          msg = JSON.parse(ev.data);
        } catch (_) {
          return;
        }
        if (msg && msg.type === "pty.replay") onReplay(msg, requested);
        return;
      }
      onOutput(ev.data);
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

  function onReplay(msg, requested) {
    const before = screenEpoch !== null ? screenEpoch : savedEpoch;
    if (msg.reset) {
      resetScreen();
      offset = Number(msg.start_offset) || 0;
    } else {
      offset = requested;
    }
    screenEpoch = String(msg.epoch);
    savedEpoch = null;
    attempt = 0;
    saveCursor();
    let text = "connected";
    if (before !== null && before !== screenEpoch) {
      text += " — the previous shell had ended; this is a new one";
    }
    setState("connected", text);
    term.focus();
  }

  function onOutput(buf) {
    const n = buf.byteLength;
    offset += n;
    queued += n;
    term.write(new Uint8Array(buf), () => {
      queued -= n;
      if (paused && queued <= QUEUE_LOW) connect("reconnecting");
    });
    scheduleSave();
    if (queued > QUEUE_HIGH && !paused) {
      closeCurrent("catching up");
      paused = true;
      setState("reconnecting", "catching up with the output…");
    }
  }

  function onClose(ev) {
    const code = ev.code;
    body.dataset.closeCode = String(code);
    saveCursor();
    if (code === 4409) {
      setState("superseded", "opened in another tab — Reconnect takes it back here", { reconnect: true });
      return;
    }
    if (code === 4410) {
      setState("ended", "session ended", { restart: true });
      return;
    }
    const fatal = FATAL[code];
    if (fatal) {
      setState("error", fatal[0] + " (" + code + ")", { reconnect: fatal[1] });
      return;
    }
    if (RETRY_CODES.has(code) || !ev.wasClean) {
      retry(code);
      return;
    }
    const why = ev.reason ? ": " + ev.reason : "";
    setState("error", "connection closed (" + code + why + ")", { reconnect: true });
  }

  function retry(code) {
    if (attempt >= BACKOFF_MS.length) {
      gaveUp = true;
      setState("error", "connection lost (" + code + ") — check that tether serve is running", {
        reconnect: true,
      });
      return;
    }
    const delay = BACKOFF_MS[attempt++];
    setState("reconnecting", "connection lost (" + code + "); reconnecting in " + delay + " ms…");
    retryTimer = setTimeout(() => connect("reconnecting"), delay);
  }

  // rotate starts a new terminal under a new attach token.
  function rotate() {
    clearTimeout(saveTimer);
    saveTimer = 0;
    drop(session, CURSOR_KEY + attach);
    attach = newAttachToken();
    save(local, ATTACH_KEY, attach);
    screenEpoch = null;
    savedEpoch = null;
    offset = 0;
    attempt = 0;
    resetScreen();
    connect("connecting");
  }

  // ---- input and size

  const encoder = new TextEncoder();
  function send(bytes) {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(bytes);
  }
  term.onData((d) => send(encoder.encode(d)));
  term.onBinary((d) => {
    const b = new Uint8Array(d.length);
    for (let i = 0; i < d.length; i++) b[i] = d.charCodeAt(i) & 0xff;
    send(b);
  });

  function fit() {
    try {
      fitAddon.fit();
    } catch (_) {
      // not laid out yet
    }
    if (ws && ws.readyState === WebSocket.OPEN) {
      ws.send("\x1b[RESIZE:" + term.cols + ";" + term.rows + "]");
    }
  }
  let fitFrame = 0;
  function scheduleFit() {
    if (!fitFrame) {
      fitFrame = requestAnimationFrame(() => {
        fitFrame = 0;
        fit();
      });
    }
  }
  window.addEventListener("resize", scheduleFit);
  if (typeof ResizeObserver === "function") {
    new ResizeObserver(scheduleFit).observe(document.getElementById("terminal"));
  }

  // ---- buttons and page events

  reconnectButton.addEventListener("click", () => {
    attempt = 0;
    connect("connecting");
  });
  restartButton.addEventListener("click", rotate);
  newButton.addEventListener("click", rotate);

  function retryIfGaveUp() {
    if (gaveUp && !document.hidden) {
      attempt = 0;
      connect("reconnecting");
    }
  }
  window.addEventListener("online", retryIfGaveUp);
  document.addEventListener("visibilitychange", retryIfGaveUp);
  window.addEventListener("pagehide", saveCursor);

  window.tether = {
    term,
    state: () => state,
    offset: () => offset,
    epoch: () => screenEpoch,
    attach: () => attach,
  };

  try {
    fitAddon.fit();
  } catch (_) {
    // laid out later; the ResizeObserver fits then
  }
  connect("connecting");
})();
