// tether browser chat: the page's Chat view, on the JSON-RPC gateway
// /api/ws (docs/PROTOCOL.md), and the switch between it and the Terminal
// view. Plain JavaScript, no build step; the package doc of
// plugins/ws/web describes the behaviour and the choices made here.
(function () {
  "use strict";

  // ---- constants

  const VIEW_KEY = "tether.view"; // localStorage: the view a new tab shows
  const TAB_VIEW_KEY = "tether.tab.view"; // sessionStorage: this tab's view, so a reload keeps it
  const CHAT_KEY = "tether.chat"; // localStorage: the stored key of the chat opened last (what a new tab opens)
  const TAB_CHAT_KEY = "tether.tab.chat"; // sessionStorage: this tab's chat
  const KEY_RE = /^[0-9]{8}_[0-9]{6}_[0-9a-f]{6}$/; // a stored session key
  const LIST_LIMIT = 100;
  const LIST_POLL_MS = 5000; // the list is asked for again this long after the last answer, while it is seen
  const LIST_EVENT_MS = 300; // a run of a chat this socket views started or ended: the list in this long
  const TITLE_MAX = 60; // a new chat is titled with the start of its first prompt

  const BACKOFF_FIRST_MS = 250; // the bound of the first retry's delay doubles per failed attempt...
  const BACKOFF_MAX_MS = 10000; // ...up to this, forever (see backoffDelay)
  const RETRY_LOG = 64; // retries kept for window.tether
  const DIAL_TIMEOUT_MS = 10000; // from new WebSocket to gateway.ready
  const REBIND_MS = 2000; // a resume that failed (storage fault, race) is tried again after this
  // A reopened chat's tool calls and failures come from its journal
  // (session.events.since from 0), whose answer holds the text about
  // twice over: a chat with more text than this is drawn from its
  // snapshot alone, so that answer stays far below the 8 MiB a socket can
  // be sent in one message.
  const HISTORY_TEXT_MAX = 512 * 1024;

  // Closes after which the chat does not retry by itself (any other code
  // from 4000 up is a refusal too, see docs/PROTOCOL.md section 15).
  const FATAL = {
    4401: "access token missing or wrong: open the URL printed by tether serve",
    4403: "the host refuses this page's origin or host name",
    4404: "the gateway is switched off on this host",
    4408: "the host only accepts connections from its own machine",
  };
  const CLOSE_TEXT = {
    1000: "closed",
    1001: "host restarting",
    1005: "closed without a code",
    1006: "connection lost",
    1011: "host error",
    1012: "transport restarting",
    1013: "too slow to keep up",
  };

  const $ = (id) => document.getElementById(id);
  const body = document.body;
  const chatPanel = $("chat");
  const tabTerminal = $("view-terminal");
  const tabChat = $("view-chat");
  const statusEl = $("chat-status");
  const reconnectButton = $("chat-reconnect");
  const listEl = $("chat-list");
  const listNote = $("chat-list-note");
  const mainEl = $("chat-main");
  const titleEl = $("chat-title");
  const runEl = $("chat-run");
  const logEl = $("chat-log");
  const input = $("chat-input");
  const sendButton = $("chat-send");
  const attachButton = $("chat-attach");
  const fileInput = $("chat-file");
  const attachList = $("chat-attachments");
  const stopButton = $("chat-stop");
  const newButton = $("chat-new");
  const notifyButton = $("chat-notify");
  const PLACEHOLDER = input.placeholder;
  const noteEl = $("chat-note");

  // ---- storage (may be unavailable; then values live for this page only)

  function storage(name) {
    try {
      return window[name];
    } catch (_) {
      return null;
    }
  }
  const tab = storage("sessionStorage");
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
  function validKey(k) {
    return typeof k === "string" && KEY_RE.test(k) ? k : null;
  }

  // ---- small DOM helpers: text goes in as text, never as HTML

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function ago(unixSeconds) {
    const ms = unixSeconds * 1000;
    const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
    if (s < 60) return "just now";
    if (s < 3600) return Math.round(s / 60) + " min ago";
    if (s < 86400) return Math.round(s / 3600) + " h ago";
    return new Date(ms).toLocaleString();
  }

  let noteTimer = 0;
  // note says something about the chat next to the prompt box (errors).
  function note(text) {
    clearTimeout(noteTimer);
    noteEl.textContent = text;
    if (text) noteTimer = setTimeout(() => (noteEl.textContent = ""), 8000);
  }

  function errText(err) {
    if (!err) return "unknown error";
    if (err.code === 4030) return "this link does not allow that (outside its scope)";
    return err.message + (typeof err.code === "number" ? " (" + err.code + ")" : "");
  }

  // ---- what this page's credential may do (gateway.ready's identity,
  // docs/PROTOCOL.md section 18): a share link of one chat made with
  // --view watches it read-only; a credential that may not create
  // sessions cannot start a new chat.

  let identity = null; // {name, scopes} of the latest gateway.ready
  // What a prompt may hold besides text (gateway.ready's
  // prompt_capabilities, the agent's: docs/PROTOCOL.md 14.5).
  let promptCaps = { image: false, audio: false, embeddedContext: false };

  function scopes() {
    return identity && Array.isArray(identity.scopes) ? identity.scopes : null;
  }

  function mayCreate() {
    const s = scopes();
    return s === null || s.includes("admin") || s.includes("new");
  }

  // viewOnly reports whether the credential reaches chat key only to
  // watch it: it holds session:KEY:view and nothing that writes to it.
  function viewOnly(key) {
    const s = scopes();
    if (s === null || !key || s.includes("admin")) return false;
    return s.includes("session:" + key + ":view") && !s.includes("session:" + key);
  }

  // ---- the views

  let view = "terminal";
  let started = false; // the chat's socket has been opened once

  function setView(next, focus) {
    view = next === "chat" ? "chat" : "terminal";
    body.dataset.view = view;
    chatPanel.hidden = view !== "chat";
    for (const [b, v] of [
      [tabTerminal, "terminal"],
      [tabChat, "chat"],
    ]) {
      b.setAttribute("aria-selected", String(v === view));
      b.tabIndex = v === view ? 0 : -1;
    }
    save(tab, TAB_VIEW_KEY, view);
    save(local, VIEW_KEY, view);
    // The terminal's page code keeps its PTY and its screen; it closes its
    // menus and takes the focus back on this event.
    document.dispatchEvent(new CustomEvent("tether:view", { detail: { view, focus: !!focus } }));
    if (view === "chat") {
      if (!started) {
        started = true;
        connect();
      } else if (ready) {
        scheduleList(0);
      }
      if (focus) focusChat();
    } else {
      clearTimeout(listTimer); // not seen: no polling (shown again, it asks at once)
      listTimer = 0;
    }
  }

  // focusChat focuses the prompt box; a disabled one takes the focus
  // once it is enabled (updateControls).
  function focusChat() {
    if (!input.disabled) input.focus();
  }

  tabTerminal.addEventListener("click", () => setView("terminal", true));
  tabChat.addEventListener("click", () => setView("chat", true));
  $("views").addEventListener("keydown", (ev) => {
    if (ev.key !== "ArrowLeft" && ev.key !== "ArrowRight") return;
    ev.preventDefault();
    const next = view === "chat" ? "terminal" : "chat";
    setView(next, false);
    (next === "chat" ? tabChat : tabTerminal).focus();
  });

  // ---- the socket and JSON-RPC

  let ws = null; // the current socket; events of any other are ignored
  let ready = false; // gateway.ready seen on ws
  let nextID = 0;
  const calls = new Map(); // id → {resolve, reject}
  let attempt = 0;
  let retryTimer = 0;
  let retryAt = 0;
  let pendingRetry = null; // {attempt, delay, bound, at} of the scheduled retry, for tests
  const retryLog = []; // the last RETRY_LOG retries scheduled, for tests
  let countdownTimer = 0;
  let dialTimer = 0;
  let outage = null; // {code, reason}: the close that started this outage
  let conn = "idle"; // idle, connecting, connected, reconnecting, error

  function setConn(next, text, canReconnect) {
    conn = next;
    body.dataset.chat = next;
    statusEl.textContent = text;
    reconnectButton.hidden = !canReconnect;
    updateControls();
  }

  function wsURL() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return scheme + "//" + location.host + "/api/ws"; // the access token goes in the cookie
  }

  function closeLabel(c) {
    return (CLOSE_TEXT[c.code] || (c.code >= 4000 ? "refused by the host" : "closed")) + " (" + c.code + ")";
  }

  function stopRetry() {
    clearTimeout(retryTimer);
    clearInterval(countdownTimer);
    retryTimer = 0;
    countdownTimer = 0;
    pendingRetry = null;
  }

  // backoffBound and backoffDelay are the terminal's (app.js): a delay
  // uniform in [0, min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS·2^attempt)) for r
  // uniform in [0, 1), so the chats a host restart dropped come back
  // spread out.
  function backoffBound(attempt) {
    return Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * Math.pow(2, attempt));
  }
  function backoffDelay(attempt, r) {
    return Math.floor(r * backoffBound(attempt));
  }

  function connect() {
    stopRetry();
    clearTimeout(dialTimer);
    closeCurrent();
    failCalls();
    ready = false;
    setConn(outage ? "reconnecting" : "connecting", outage ? "chat: " + closeLabel(outage) + " — reconnecting…" : "chat: connecting…");
    let sock;
    try {
      sock = new WebSocket(wsURL());
    } catch (err) {
      setConn("error", "chat: cannot open a WebSocket: " + err.message, true);
      return;
    }
    ws = sock;
    dialTimer = setTimeout(() => {
      if (ws !== sock || ready) return;
      closeCurrent();
      onClose({ code: 1006, reason: "no answer from the host" });
    }, DIAL_TIMEOUT_MS);
    sock.onmessage = (ev) => {
      if (ws === sock) onMessage(ev.data);
    };
    sock.onclose = (ev) => {
      if (ws !== sock) return;
      ws = null;
      onClose(ev);
    };
  }

  // closeCurrent closes the current socket on purpose: its events are ignored.
  function closeCurrent() {
    const old = ws;
    ws = null;
    if (old) {
      try {
        old.close(1000, "replaced");
      } catch (_) {
        // already closed
      }
    }
  }

  // failCalls rejects every call still waiting for its answer: the socket
  // it went out on is gone.
  function failCalls() {
    const lost = { code: "closed", message: "the connection was lost" };
    for (const [, p] of calls) p.reject(lost);
    calls.clear();
  }

  function onClose(ev) {
    clearTimeout(dialTimer);
    ready = false;
    const c = { code: ev.code, reason: ev.reason || "" };
    body.dataset.chatCloseCode = String(c.code);
    failCalls();
    if (cur) {
      // An answer too large for the socket closes it with 1013: a
      // journal asked for to draw a reopened chat is not asked for again.
      if (cur.history && cur.key && c.code === 1013) noHistory.add(cur.key);
      // A reopened chat whose journal did not come is drawn again whole.
      if (cur.history) cur.drawn = false;
      cur.history = false;
      cur.synced = false;
    }
    if (FATAL[c.code] || c.code >= 4000) {
      let why = FATAL[c.code] || c.reason || "not retried";
      if (c.code === 4401 && /revoked|expired/.test(c.reason)) why = "the link this page was opened with was " + (/revoked/.test(c.reason) ? "revoked" : "expired") + ": ask its owner for a new one";
      setConn("error", "chat: " + closeLabel(c) + " — " + why, true);
      return;
    }
    if (!outage) outage = c;
    const bound = backoffBound(attempt);
    const delay = backoffDelay(attempt, Math.random());
    attempt++;
    retryAt = Date.now() + delay;
    pendingRetry = { attempt, delay, bound, at: retryAt };
    retryLog.push(pendingRetry);
    if (retryLog.length > RETRY_LOG) retryLog.shift();
    retryTimer = setTimeout(connect, delay);
    showCountdown();
    countdownTimer = setInterval(showCountdown, 250);
  }

  function showCountdown() {
    const left = Math.max(0, retryAt - Date.now());
    const when = left >= 1000 ? "reconnecting in " + Math.ceil(left / 1000) + " s" : "reconnecting…";
    const text = "chat: " + closeLabel(outage) + " — " + when;
    if (statusEl.textContent !== text) setConn("reconnecting", text, true);
  }

  function retryNow() {
    if (retryTimer) connect();
  }
  window.addEventListener("online", retryNow);
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) return;
    retryNow();
    if (ready && view === "chat") scheduleList(0);
  });
  reconnectButton.addEventListener("click", () => {
    attempt = 0;
    outage = null;
    connect();
  });

  function onMessage(data) {
    if (typeof data !== "string") return;
    let m;
    try {
      m = JSON.parse(data);
    } catch (_) {
      return;
    }
    if (!m || typeof m !== "object") return;
    if (m.method === "event") {
      const p = m.params || {};
      if (p.type === "gateway.ready") {
        identity = p.payload && typeof p.payload.identity === "object" ? p.payload.identity : null;
        const pc = p.payload && typeof p.payload.prompt_capabilities === "object" && p.payload.prompt_capabilities;
        promptCaps = { image: !!(pc && pc.image), audio: !!(pc && pc.audio), embeddedContext: !!(pc && pc.embeddedContext) };
        onReady();
      }
      else onEvent(p);
      return;
    }
    const c = calls.get(m.id);
    if (!c) return;
    calls.delete(m.id);
    if (m.error) c.reject({ code: m.error.code, message: String(m.error.message || "error") });
    else c.resolve(m.result);
  }

  // call sends one request and resolves with its result; it rejects with
  // {code, message}: the error's, or code "closed" when the socket is not
  // (or no longer) there.
  function call(method, params) {
    if (!ready || !ws || ws.readyState !== WebSocket.OPEN) {
      return Promise.reject({ code: "closed", message: "not connected" });
    }
    const id = ++nextID;
    const sock = ws;
    return new Promise((resolve, reject) => {
      calls.set(id, { resolve, reject });
      sock.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  function onReady() {
    clearTimeout(dialTimer);
    ready = true;
    attempt = 0;
    outage = null;
    setConn("connected", "chat: connected");
    scheduleList(0);
    if (cur && cur.key) bind(cur, true);
    offerPush();
  }

  // ---- Web Push: "Notify me" (docs/NOTIFICATIONS.md, "Web Push")

  // pushKey is the host's VAPID key once push.key answered; the button
  // shows only when the host pushes (--notify-push) and this browser can.
  let pushKey = "";
  function pushSupported() {
    return "serviceWorker" in navigator && "PushManager" in window && "Notification" in window && window.isSecureContext;
  }

  function offerPush() {
    if (pushKey || !pushSupported()) return;
    call("push.key", {}).then((r) => {
      if (!r || typeof r.key !== "string" || !r.key) return;
      pushKey = r.key;
      notifyButton.hidden = false;
      navigator.serviceWorker.getRegistration("./").then(async (reg) => {
        const sub = reg && (await reg.pushManager.getSubscription());
        if (sub) pushOn();
      }).catch(() => {});
    }, () => {}); // -32601: this host does not push
  }

  function pushOn() {
    notifyButton.textContent = "Notifying you";
    notifyButton.disabled = true;
    notifyButton.title = "This browser gets a notification when an agent waits for you or an answer is ready while no page shows it";
  }

  // b64uBytes decodes base64url (the VAPID key) for applicationServerKey.
  function b64uBytes(s) {
    const b = atob(s.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((s.length + 3) % 4));
    return Uint8Array.from(b, (c) => c.charCodeAt(0));
  }

  async function subscribePush() {
    try {
      if ((await Notification.requestPermission()) !== "granted") {
        note("notifications are blocked for this page in the browser's settings");
        return;
      }
      const reg = await navigator.serviceWorker.register("sw.js");
      await navigator.serviceWorker.ready;
      const sub = (await reg.pushManager.getSubscription()) ||
        (await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: b64uBytes(pushKey) }));
      const j = sub.toJSON();
      await call("push.subscribe", { endpoint: j.endpoint, keys: j.keys });
      pushOn();
      pushSubscribed++;
    } catch (err) {
      note("notifications not turned on: " + (err && err.name ? err.message : err && err.message ? errText(err) : String(err)));
    }
  }
  let pushSubscribed = 0; // for tests
  notifyButton.addEventListener("click", subscribePush);

  // ---- the list of stored sessions

  // The list is kept current while the chat view is seen: asked for when
  // the view is shown, the tab becomes visible or the socket is back, soon
  // after a run of a chat this socket views starts or ends, and
  // LIST_POLL_MS after the previous answer. One request at a time; asks
  // made meanwhile become one more request after it.
  let listTimer = 0;
  let listDue = 0; // when listTimer fires
  let listBusy = false; // a session.list is on its way
  let listAgain = false; // asked for while it was
  let listRefreshes = 0; // answers rendered, for tests

  function listSeen() {
    return view === "chat" && !document.hidden;
  }

  // scheduleList asks for the list within ms (an earlier ask stands).
  function scheduleList(ms) {
    const due = Date.now() + ms;
    if (listTimer && listDue <= due) return;
    clearTimeout(listTimer);
    listDue = due;
    listTimer = setTimeout(refreshList, ms);
  }

  function refreshList() {
    clearTimeout(listTimer);
    listTimer = 0;
    if (!ready) return; // gateway.ready asks again
    if (listBusy) {
      listAgain = true;
      return;
    }
    listBusy = true;
    Promise.all([call("session.list", { limit: LIST_LIMIT }), call("session.active_list", {})])
      .then(
        ([stored, active]) => {
          listRefreshes++;
          renderList(stored.sessions || [], active.sessions || []);
        },
        (err) => {
          if (err.code !== "closed") listNote.textContent = "cannot list the chats: " + errText(err);
        },
      )
      .finally(() => {
        listBusy = false;
        if (!ready) return;
        if (listAgain) {
          listAgain = false;
          scheduleList(0);
        } else if (listSeen()) {
          scheduleList(LIST_POLL_MS);
        }
      });
  }

  // listed tells whether a stored session is in the list: one with a
  // message of its own, one with a run in flight, and the chat this tab
  // has open. A session made and never prompted (New chat on another
  // client, a bare ACP session/new) has nothing to show yet.
  function listed(s, a) {
    return s.message_count > 0 || (a && a.status === "working") || (cur !== null && cur.key === s.id);
  }

  // lastActive is when a session was last active, in Unix seconds: as
  // stored (session.list), or later as the live session says.
  function lastActive(s, a) {
    return Math.max(Number(s.last_active) || Number(s.started_at) || 0, a ? Number(a.last_active) || 0 : 0);
  }

  function renderList(stored, active) {
    const live = new Map(active.map((s) => [s.session_key, s]));
    const focused = listEl.contains(document.activeElement) ? document.activeElement.parentElement.dataset.key : null;
    // Most recently active first (ties: session.list's order, newest first).
    const shown = stored
      .filter((s) => listed(s, live.get(s.id)))
      .map((s, i) => ({ s, a: live.get(s.id), at: lastActive(s, live.get(s.id)), i }))
      .sort((x, y) => y.at - x.at || x.i - y.i);
    listEl.textContent = "";
    listNote.textContent = shown.length ? "" : "No chats yet.";
    for (const { s, a, at } of shown) {
      const li = el("li");
      li.dataset.key = s.id;
      li.dataset.lastActive = String(at);
      const pick = el("button", "pick");
      pick.type = "button";
      if (cur && cur.key === s.id) pick.setAttribute("aria-current", "true");
      const count = s.message_count || 0;
      const bits = [ago(at), count + (count === 1 ? " message" : " messages")];
      if (a && a.status === "working") bits.push("working…");
      const title = (a && a.title) || s.title || "";
      pick.append(el("span", "name", title || "Untitled chat"), el("span", "meta", bits.join(" · ")));
      pick.title = "Open this chat (" + s.id + "); last active " + new Date(at * 1000).toLocaleString() + ", started " + new Date(s.started_at * 1000).toLocaleString();
      pick.addEventListener("click", () => openChat(s.id, true));
      li.append(pick);
      listEl.append(li);
      if (s.id === focused) pick.focus(); // a refresh keeps the keyboard's place
      // The open chat's title, once it has one (a chat named by its first
      // prompt, perhaps on another client).
      if (cur && cur.key === s.id && cur.synced && title && titleEl.textContent !== title) titleEl.textContent = title;
    }
  }

  function markCurrent() {
    for (const b of listEl.querySelectorAll(".pick")) {
      if (cur && cur.key === b.parentElement.dataset.key) b.setAttribute("aria-current", "true");
      else b.removeAttribute("aria-current");
    }
  }

  // ---- the open chat

  // cur is the chat this tab shows: key is its stored key (null for a new
  // chat not stored yet), sid its runtime id on the current socket, epoch
  // and seq the event numbering the log is drawn up to. While synced is
  // false (binding, catching up) its live events wait in pending.
  let cur = null;
  const noHistory = new Set(); // stored keys whose journal this tab no longer asks for (its answer closed the socket)
  let lastCatchUp = null; // for tests: {last_seen, events, latest_seq} of the latest session.events.since

  function newChatState(key) {
    return {
      key,
      sid: null,
      epoch: null,
      seq: 0,
      drawn: false, // the log shows this chat at (epoch, seq)
      synced: false,
      pending: [],
      running: false,
      submitting: false,
      streamRow: null, // the assistant row of the run in flight
      perms: new Map(), // request_id → permission card state
      tools: new Map(), // toolCallId → {li, title, status}, of the run in flight
      history: false, // the journal of a reopened chat is on its way
      rebindTimer: 0,
      binds: 0, // bumps on every bind; the answers of an older one are dropped
    };
  }

  function setCurrent(c) {
    if (cur) clearTimeout(cur.rebindTimer);
    cur = c;
    logEl.textContent = "";
    setRun("none", "");
    if (c.key) {
      save(tab, TAB_CHAT_KEY, c.key);
      save(local, CHAT_KEY, c.key);
    }
    markCurrent();
    updateControls();
  }

  function openChat(key, focus) {
    if (cur && cur.key === key && (cur.synced || !ready)) {
      if (focus) focusChat();
      return;
    }
    setCurrent(newChatState(key));
    titleEl.textContent = "Opening…";
    if (ready) bind(cur, false);
    if (focus) focusChat();
  }

  function newChat() {
    const c = newChatState(null);
    setCurrent(c);
    titleEl.textContent = "New chat";
    setRun("none", "type a prompt to start");
    updateControls();
    focusChat();
  }
  newButton.addEventListener("click", newChat);

  function stale(c) {
    return cur !== c;
  }

  // bind resumes c by its stored key on the current socket. With catchUp
  // (the socket dropped while the log was drawn) and the same epoch, it
  // asks session.events.since for exactly the events missed and applies
  // them; otherwise it redraws from the snapshot.
  function bind(c, catchUp) {
    clearTimeout(c.rebindTimer);
    c.synced = false;
    c.pending = [];
    const g = ++c.binds;
    const outdated = () => cur !== c || c.binds !== g; // another chat, or a later bind of this one
    call("session.resume", { session_id: c.key }).then(
      (snap) => {
        if (outdated()) return;
        c.sid = snap.session_id;
        if (!(catchUp && c.drawn && c.epoch === snap.epoch)) {
          redraw(c, snap);
          return;
        }
        const lastSeen = c.seq;
        call("session.events.since", { session_id: snap.session_id, last_seen: lastSeen }).then(
          (res) => {
            if (outdated()) return;
            if (res.truncated || res.epoch !== c.epoch || res.latest_seq < snap.latest_seq) {
              redraw(c, snap);
              return;
            }
            lastCatchUp = { last_seen: lastSeen, events: res.events.length, latest_seq: res.latest_seq };
            c.synced = true;
            for (const e of res.events) apply(c, e);
            flush(c);
            updateControls();
          },
          (err) => {
            if (outdated() || err.code === "closed") return;
            redraw(c, snap);
          },
        );
      },
      (err) => {
        if (outdated() || err.code === "closed") return; // the next gateway.ready binds again
        if (err.code === 4007 && /not found/.test(err.message)) {
          drop(tab, TAB_CHAT_KEY);
          if (load(local, CHAT_KEY) === c.key) drop(local, CHAT_KEY);
          titleEl.textContent = "Chat not found";
          setRun("failed", "no stored chat " + c.key);
          c.key = null;
          scheduleList(0);
          updateControls();
          return;
        }
        setRun("failed", "cannot open the chat: " + errText(err) + "; trying again");
        c.rebindTimer = setTimeout(() => {
          if (!outdated() && ready) bind(c, catchUp);
        }, REBIND_MS);
      },
    );
  }

  // flush applies the live events that arrived while c was not synced.
  function flush(c) {
    const q = c.pending;
    c.pending = [];
    q.sort((a, b) => a.seq - b.seq);
    for (const e of q) apply(c, e);
  }

  function onEvent(e) {
    if (!e || typeof e.type !== "string") return;
    if ((e.type === "message.complete" || e.type === "message.start") && listSeen()) scheduleList(LIST_EVENT_MS);
    const c = cur;
    if (!c || !c.sid || e.session_id !== c.sid) return; // another chat this socket views, or not bound yet
    if (!c.synced) c.pending.push(e);
    else apply(c, e);
  }

  // apply applies one event of c, each seq once and in order; a gap (which
  // the protocol rules out) makes it redraw from a fresh snapshot.
  function apply(c, e) {
    if (!c.synced) return; // a bind is under way: its snapshot holds this event
    const seq = Number(e.seq);
    if (!(seq > c.seq)) return;
    if (seq !== c.seq + 1) {
      bind(c, false);
      return;
    }
    c.seq = seq;
    const p = e.payload || {};
    switch (e.type) {
      case "message.start":
        if (c.streamRow) finishRow(c.streamRow, "");
        addRow("user", typeof p.prompt === "string" ? p.prompt : c.sent || "", false, p.content);
        c.streamRow = addRow("assistant", "", true);
        c.tools = new Map(); // a run's tool calls are its own
        c.running = true;
        setRun("working", "");
        break;
      case "message.delta":
        if (typeof p.text !== "string") break;
        if (!c.streamRow) c.streamRow = addRow("assistant", "", true);
        appendText(c.streamRow, p.text);
        break;
      case "message.complete": {
        const row = c.streamRow || addRow("assistant", "", true);
        // The complete text is the deltas' concatenation; if not, it wins.
        if (typeof p.text === "string" && rowText(row) !== p.text) setRowText(row, p.text);
        endRow(row, p);
        c.streamRow = null;
        c.running = false;
        setRun(String(p.status || "complete"), runWhy(p));
        break;
      }
      case "permission.request":
        addPermission(c, p);
        break;
      case "permission.resolved":
        resolvePermission(c, p);
        break;
      case "acp.update":
        toolUpdate(c, p);
        break;
      default:
        break; // an event type this page does not know: ignored
    }
    updateControls();
  }

  // redraw draws c from a snapshot: every message, the answer in flight
  // so far, and the open permission requests.
  function redraw(c, snap) {
    c.key = snap.session_key;
    c.sid = snap.session_id;
    c.epoch = snap.epoch;
    c.seq = Number(snap.latest_seq) || 0;
    c.running = !!snap.running;
    c.streamRow = null;
    c.perms = new Map();
    c.tools = new Map();
    save(tab, TAB_CHAT_KEY, c.key);
    save(local, CHAT_KEY, c.key);
    titleEl.textContent = snap.title || "Untitled chat";
    logEl.textContent = "";
    const msgs = Array.isArray(snap.messages) ? snap.messages : [];
    msgs.forEach((m, i) => {
      const last = i === msgs.length - 1;
      // While a run is in flight the last row is its answer so far.
      const inFlight = last && c.running && m.role === "assistant";
      const row = addRow(m.role === "user" ? "user" : "assistant", String(m.text || ""), inFlight, m.content);
      if (inFlight) c.streamRow = row;
    });
    for (const p of snap.pending_permissions || []) addPermission(c, p);
    setRun(c.running ? "working" : "idle", "");
    c.drawn = true;
    markCurrent();
    const size = msgs.reduce((n, m) => n + String(m.text || "").length, 0);
    if (!(c.seq > 0) || size > HISTORY_TEXT_MAX || noHistory.has(c.key)) {
      synced(c);
      return;
    }
    // The snapshot has the text only: the tool calls and how each run
    // ended come from the journal and session.runs. Live events wait
    // meanwhile (c.synced is false), then apply after them.
    c.synced = false;
    const g = c.binds;
    const outdated = () => cur !== c || c.binds !== g;
    c.history = true;
    Promise.all([call("session.events.since", { session_id: snap.session_id, last_seen: 0 }), call("session.runs", { session_id: snap.session_id })]).then(
      ([journal, runs]) => {
        if (outdated()) return;
        c.history = false;
        drawHistory(c, snap, journal, runs);
        synced(c);
      },
      (err) => {
        if (outdated()) return;
        c.history = false;
        if (err.code === "closed") return; // the next gateway.ready binds again
        synced(c); // drawn as far as the snapshot goes
      },
    );
  }

  // synced marks c drawn up to its seq and applies what waited.
  function synced(c) {
    c.synced = true;
    flush(c);
    updateControls();
  }

  // drawHistory adds to the rows redraw drew what their text leaves out, as
  // they were shown live: each run's tool calls (its acp.update events)
  // and how it ended (its message.complete, else its status in
  // session.runs), and says in the header how the last one ended. Every
  // run stored its prompt and its answer as two rows, so the runs are the
  // last rows of the log, two each (rows before them are a parent's);
  // the runs are the journal's up to the snapshot's seq (later ones come
  // live). A journal that lost its first events (pruned) shows what it
  // still has.
  function drawHistory(c, snap, journal, runs) {
    if (!journal || journal.epoch !== snap.epoch) return; // not the history the snapshot tells
    const latest = Number(snap.latest_seq) || 0;
    const byRun = new Map(); // run_id → {tools: Map(toolCallId → update fields), end: message.complete payload}
    const order = []; // run ids, in journal order
    let run = null;
    for (const e of journal.events || []) {
      if (!(Number(e.seq) <= latest)) break;
      const p = e.payload || {};
      if (e.type === "message.start") {
        run = { tools: new Map(), end: null };
        byRun.set(String(p.run_id), run);
        order.push(String(p.run_id));
      } else if (run && e.type === "acp.update") {
        toolInfo(run.tools, p);
      } else if (run && e.type === "message.complete") {
        run.end = p;
        run = null;
      }
    }
    const list = runs && Array.isArray(runs.runs) ? runs.runs : [];
    // The snapshot's runs end with the last one the journal started up to
    // its seq (session.runs may have a newer one already).
    const n = order.length ? list.findIndex((r) => r.run_id === order[order.length - 1]) + 1 : 0;
    if (n === 0) return;
    const rows = [...logEl.children].filter((li) => li.classList.contains("msg"));
    const base = rows.length - 2 * n;
    if (base < 0) return;
    for (let k = 0; k < n; k++) {
      const ask = rows[base + 2 * k];
      const answer = rows[base + 2 * k + 1];
      if (!ask.classList.contains("user") || !answer.classList.contains("assistant")) return; // not the shape runs leave
    }
    let last = null;
    for (let k = 0; k < n; k++) {
      const answer = rows[base + 2 * k + 1];
      const r = list[k];
      const j = byRun.get(r.run_id);
      const inFlight = c.running && k === n - 1 && r.status === "running" && !(j && j.end);
      if (j) {
        const box = answer.querySelector(".items");
        const before = box.querySelector(".perm"); // a pending request redraw showed: its tool call came first
        for (const [id, u] of j.tools) {
          const t = { li: el("li", "tool"), title: u.title || "", status: u.status || "" };
          t.li.dataset.toolCallId = id;
          drawTool(t, id);
          box.insertBefore(t.li, before);
          if (inFlight) c.tools.set(id, t);
        }
      }
      if (inFlight) continue;
      const end = (j && j.end) || { status: r.status };
      if (!end.status) end.status = r.status;
      endRow(answer, end);
      last = end;
    }
    if (last && !c.running) {
      const why = runWhy(last);
      if (last.status === "failed" || last.status === "interrupted" || why) setRun(String(last.status), why);
    }
  }

  // ---- rows

  function pinned() {
    return logEl.scrollHeight - logEl.scrollTop - logEl.clientHeight < 24;
  }
  function scrollDown(wasPinned) {
    if (wasPinned) logEl.scrollTop = logEl.scrollHeight;
  }

  function addRow(role, text, streaming, content) {
    const p = pinned();
    const li = el("li", "msg " + role);
    li.append(el("div", "who", role === "user" ? "You" : "Agent"), el("ul", "items"), attachedList(content), el("div", "text", text));
    if (streaming) {
      li.dataset.status = "streaming";
      li.setAttribute("aria-busy", "true");
    }
    logEl.append(li);
    scrollDown(p);
    return li;
  }

  // attachedList shows a prompt's blocks other than text: an image as a
  // thumbnail, a resource or a link by its name.
  function attachedList(content) {
    const ul = el("ul", "attached");
    for (const b of Array.isArray(content) ? content : []) {
      if (!b || typeof b !== "object" || b.type === "text") continue;
      const li = el("li");
      li.dataset.type = String(b.type);
      if (b.type === "image" && typeof b.data === "string" && /^image\/[\w.+-]+$/.test(String(b.mimeType))) {
        const img = document.createElement("img");
        img.src = "data:" + b.mimeType + ";base64," + b.data;
        img.alt = blockName(b) || "image";
        li.append(img);
      } else {
        li.textContent = "📎 " + (blockName(b) || String(b.type));
      }
      ul.append(li);
    }
    return ul;
  }
  function blockName(b) {
    const uri = b.type === "resource" && b.resource ? b.resource.uri : b.uri;
    if (b.name) return String(b.name);
    if (typeof uri !== "string") return "";
    try {
      return decodeURIComponent(uri.slice(uri.lastIndexOf("/") + 1));
    } catch (_) {
      return uri;
    }
  }

  // appendText adds a delta as a text node of its own.
  function appendText(row, text) {
    const p = pinned();
    row.querySelector(".text").append(document.createTextNode(text));
    scrollDown(p);
  }
  function rowText(row) {
    return row.querySelector(".text").textContent;
  }
  function setRowText(row, text) {
    row.querySelector(".text").textContent = text;
  }
  function finishRow(row, status) {
    row.removeAttribute("aria-busy");
    if (status) row.dataset.status = status;
    else delete row.dataset.status;
  }

  // runWhy says why a run ended as it did (message.complete's payload):
  // a failure's reason, or a stop reason other than the usual ones.
  function runWhy(p) {
    if (p.reason) return String(p.reason);
    if (p.stop_reason && p.stop_reason !== "end_turn" && p.stop_reason !== "cancelled") return "stop reason " + p.stop_reason;
    return "";
  }

  // endRow settles a run's answer row as message.complete p says: its
  // status, and under its text a line saying why it failed (or stopped
  // for a reason of note).
  function endRow(row, p) {
    const status = String(p.status || "");
    finishRow(row, status);
    const why = runWhy(p);
    const text = status === "failed" ? "Failed" + (why ? ": " + why : "") : why ? "Ended: " + why : "";
    let line = row.querySelector(".end");
    if (!text) {
      if (line) line.remove();
      return;
    }
    if (!line) {
      line = el("div", "end");
      row.append(line);
    }
    line.textContent = text;
  }

  // items is where a run's tool calls and permission cards go: in the
  // answer in flight, else in a row of their own.
  function items(c) {
    if (!c.streamRow) c.streamRow = addRow("assistant", "", c.running);
    return c.streamRow.querySelector(".items");
  }

  // ---- run status

  const RUN_TEXT = {
    none: "",
    idle: "idle",
    working: "working…",
    complete: "idle",
    interrupted: "stopped",
    failed: "failed",
  };
  function setRun(state, why) {
    mainEl.dataset.run = state;
    let t = RUN_TEXT[state] !== undefined ? RUN_TEXT[state] : state;
    if (why) t = state === "working" || state === "none" || !t ? why : t + ": " + why;
    runEl.textContent = t;
  }

  function waiting(c) {
    let n = 0;
    for (const [, p] of c.perms) if (!p.resolved) n++;
    return n;
  }

  function updateControls() {
    const c = cur;
    const online = conn === "connected";
    const idle = !!c && !c.running && !c.submitting && (c.key === null || c.synced);
    const wasFocused = document.activeElement === input;
    const watching = !!c && viewOnly(c.key);
    body.dataset.chatReadonly = watching ? "1" : "";
    input.disabled = !(online && idle) || watching || (!!c && c.key === null && !mayCreate());
    input.placeholder = watching
      ? "Read-only: this link lets you watch this chat, not prompt it"
      : c && c.key === null && !mayCreate()
        ? "This link does not allow starting a chat: pick the chat it opens"
        : PLACEHOLDER;
    sendButton.disabled = input.disabled;
    attachButton.hidden = !(promptCaps.image || promptCaps.embeddedContext);
    attachButton.disabled = input.disabled;
    fileInput.accept = promptCaps.embeddedContext ? "" : "image/*";
    stopButton.disabled = !(online && c && c.sid && c.running) || watching;
    newButton.disabled = !mayCreate();
    if (online) statusEl.textContent = watching ? "chat: connected · read-only: you watch, prompts and answers are not yours to send" : "chat: connected";
    for (const [, p] of c ? c.perms : []) renderPermission(c, p);
    if (c && c.running) {
      const n = waiting(c);
      setRun("working", n ? "waiting for an answer to " + (n > 1 ? n + " permission requests" : "a permission request") : "");
    }
    // Back from a run: the prompt box takes the focus again.
    if (!input.disabled && view === "chat" && (wasFocused || document.activeElement === body || document.activeElement === null)) {
      input.focus();
    }
  }

  // ---- sending and stopping

  function titleFor(text) {
    const line = text.trim().split("\n")[0].trim();
    return line.length > TITLE_MAX ? line.slice(0, TITLE_MAX - 1) + "…" : line;
  }

  // ---- attachments: files read into ACP content blocks (an image
  // block, else an embedded resource: its text when it is UTF-8 text,
  // else its bytes), sent with the prompt as prompt.submit's content.

  let attached = []; // {name, block}
  // The socket takes 1 MiB a message: what does not fit is not sent.
  const ATTACH_MAX = 1000000;

  function b64(buf) {
    let s = "";
    const bytes = new Uint8Array(buf);
    for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return btoa(s);
  }

  async function blockOf(file) {
    const buf = await file.arrayBuffer();
    const uri = "file:///" + encodeURIComponent(file.name);
    const mime = file.type || "application/octet-stream";
    if (/^image\//.test(file.type) && promptCaps.image) return { type: "image", mimeType: mime, data: b64(buf), uri };
    if (!promptCaps.embeddedContext) return null;
    try {
      const text = new TextDecoder("utf-8", { fatal: true }).decode(buf);
      if (!text.includes("\u0000")) return { type: "resource", resource: { uri, mimeType: file.type || "text/plain", text } };
    } catch (_) {
      // not UTF-8 text: its bytes
    }
    return { type: "resource", resource: { uri, mimeType: mime, blob: b64(buf) } };
  }

  function drawAttached() {
    attachList.textContent = "";
    attached.forEach((a, i) => {
      const li = el("li", "", "📎 " + a.name);
      const rm = el("button", "", "×");
      rm.type = "button";
      rm.title = "Remove " + a.name;
      rm.addEventListener("click", () => {
        attached.splice(i, 1);
        drawAttached();
      });
      li.append(rm);
      attachList.append(li);
    });
  }

  attachButton.addEventListener("click", () => fileInput.click());
  fileInput.addEventListener("change", async () => {
    const files = Array.from(fileInput.files || []);
    fileInput.value = "";
    await attachFiles(files);
  });
  // A pasted image (a screenshot) is attached like a chosen file.
  input.addEventListener("paste", (ev) => {
    const files = Array.from((ev.clipboardData && ev.clipboardData.files) || []).filter((f) => /^image\//.test(f.type));
    if (!files.length || !promptCaps.image || input.disabled) return;
    ev.preventDefault();
    void attachFiles(files);
  });

  async function attachFiles(files) {
    for (const file of files) {
      let block = null;
      try {
        block = await blockOf(file);
      } catch (err) {
        note("cannot read " + file.name + ": " + err);
        continue;
      }
      if (!block) note("cannot attach " + file.name + ": the agent takes images only");
      else attached.push({ name: file.name, block });
    }
    drawAttached();
  }

  function send() {
    const c = cur;
    const text = input.value;
    const content = attached.map((a) => a.block);
    if (!c || input.disabled || (text.trim() === "" && content.length === 0)) return;
    if (content.length && JSON.stringify(content).length + text.length > ATTACH_MAX) {
      note("not sent: the attachments are too big (a prompt is at most 1 MB here)");
      return;
    }
    const sentAttached = attached;
    c.submitting = true;
    updateControls();
    const create = c.key
      ? Promise.resolve()
      : call("session.create", { title: titleFor(text) }).then((snap) => {
          if (stale(c)) throw { code: "stale" };
          redraw(c, snap);
          scheduleList(0);
        });
    create
      .then(() => {
        c.sent = text;
        return call("prompt.submit", content.length ? { session_id: c.sid, text, content } : { session_id: c.sid, text });
      })
      .then(
        () => {
          if (!stale(c) && input.value === text) input.value = "";
          if (attached === sentAttached) {
            attached = [];
            drawAttached();
          }
        },
        (err) => {
          if (stale(c) || err.code === "stale") return;
          if (err.code === "closed") note("not sent: the connection was lost (the prompt stays in the box)");
          else if (err.code === 4009) note("not sent: an answer is still running");
          else note("not sent: " + errText(err));
          if (err.code === 4001) bind(c, true);
        },
      )
      .finally(() => {
        c.submitting = false;
        updateControls();
      });
  }

  sendButton.addEventListener("click", send);
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing && !ev.ctrlKey && !ev.altKey && !ev.metaKey) {
      ev.preventDefault();
      send();
    }
  });
  stopButton.addEventListener("click", () => {
    const c = cur;
    if (!c || !c.sid) return;
    call("session.interrupt", { session_id: c.sid }).catch((err) => {
      if (!stale(c)) note("cannot stop: " + errText(err));
    });
  });

  // ---- permission requests

  function addPermission(c, p) {
    if (!p || typeof p.request_id !== "string" || c.perms.has(p.request_id)) return;
    const tc = p.tool_call && typeof p.tool_call === "object" ? p.tool_call : {};
    const card = el("li", "perm");
    card.dataset.requestId = p.request_id;
    card.setAttribute("role", "group");
    const what = tc.title || tc.toolCallId || "a tool call";
    card.setAttribute("aria-label", "Permission request: " + what);
    const head = el("div", "perm-head", "Permission requested: ");
    head.append(el("b", "", what));
    if (tc.kind) head.append(el("span", "perm-kind", " (" + tc.kind + ")"));
    const actions = el("div", "actions");
    const options = Array.isArray(p.options) ? p.options : [];
    for (const o of options) {
      if (!o || typeof o.optionId !== "string") continue;
      const b = el("button", /^allow/.test(o.kind || "") ? "primary" : /^reject/.test(o.kind || "") ? "danger" : "", o.name || o.optionId);
      b.type = "button";
      b.dataset.optionId = o.optionId;
      b.addEventListener("click", () => respond(c, p.request_id, o.optionId));
      actions.append(b);
    }
    const cancel = el("button", "cancel", "Cancel");
    cancel.type = "button";
    cancel.title = "Answer the request as cancelled";
    cancel.addEventListener("click", () => respond(c, p.request_id, null));
    actions.append(cancel);
    const outcome = el("div", "perm-outcome");
    outcome.setAttribute("role", "status");
    card.append(head, actions, outcome);
    const perm = { id: p.request_id, card, options, resolved: false, busy: false, mine: false, option: null, by: "" };
    c.perms.set(p.request_id, perm);
    const wasPinned = pinned();
    items(c).append(card);
    scrollDown(wasPinned);
    renderPermission(c, perm);
  }

  function respond(c, requestID, optionID) {
    const perm = c.perms.get(requestID);
    if (!perm || perm.resolved || perm.busy || stale(c)) return;
    perm.busy = true;
    renderPermission(c, perm);
    call("permission.respond", { session_id: c.sid, request_id: requestID, option_id: optionID }).then(
      () => {
        perm.busy = false;
        perm.mine = true;
        renderPermission(c, perm);
      },
      (err) => {
        perm.busy = false;
        if (err.code !== 4090 && !stale(c)) note("cannot answer: " + errText(err));
        renderPermission(c, perm);
      },
    );
  }

  function resolvePermission(c, p) {
    const perm = c.perms.get(p.request_id);
    if (!perm) return;
    perm.resolved = true;
    perm.option = typeof p.option_id === "string" ? p.option_id : null;
    perm.by = String(p.by || "");
    perm.transport = String(p.transport || "");
    renderPermission(c, perm);
  }

  function renderPermission(c, perm) {
    const online = conn === "connected" && c.synced;
    const watching = viewOnly(c.key);
    perm.card.dataset.state = perm.resolved ? "resolved" : "pending";
    perm.card.querySelector(".actions").hidden = perm.resolved || watching;
    for (const b of perm.card.querySelectorAll(".actions button")) b.disabled = perm.busy || !online;
    const out = perm.card.querySelector(".perm-outcome");
    if (!perm.resolved) {
      out.textContent = perm.busy ? "answering…" : watching ? "waiting for an answer (read-only: not yours to give)" : "";
      return;
    }
    if (perm.busy) {
      out.textContent = "answered…"; // this tab's answer is on its way back
      return;
    }
    const o = perm.options.find((x) => x && x.optionId === perm.option);
    const what = perm.option === null ? "Cancelled" : (o && (o.name || o.optionId)) || perm.option;
    let text;
    if (perm.by === "cancelled") text = "Withdrawn: the run ended before an answer";
    else if (perm.mine) text = what + " — answered here";
    else {
      // Who (the credential's name) and through what (the transport).
      const who = [perm.by, perm.transport ? "via " + perm.transport : ""].filter(Boolean).join(" ");
      text = what + " — answered by another client" + (who ? " (" + who + ")" : "");
    }
    out.textContent = text;
  }

  // ---- tool calls (ACP agents), one line each

  function isTool(u) {
    return !!u && (u.sessionUpdate === "tool_call" || u.sessionUpdate === "tool_call_update") && typeof u.toolCallId === "string" && u.toolCallId !== "";
  }

  // toolInfo folds a tool call update into tools (toolCallId → {title,
  // status}), as toolUpdate does on screen.
  function toolInfo(tools, u) {
    if (!isTool(u)) return;
    const t = tools.get(u.toolCallId) || { title: "", status: "" };
    if (typeof u.title === "string" && u.title) t.title = u.title;
    if (typeof u.status === "string" && u.status) t.status = u.status;
    tools.set(u.toolCallId, t);
  }

  function drawTool(t, id) {
    t.li.dataset.status = t.status;
    t.li.textContent = "Tool: " + (t.title || id) + (t.status ? " — " + t.status : "");
  }

  function toolUpdate(c, u) {
    if (!isTool(u)) return;
    const id = u.toolCallId;
    let t = c.tools.get(id);
    if (!t) {
      t = { li: el("li", "tool"), title: "", status: "" };
      t.li.dataset.toolCallId = id;
      c.tools.set(id, t);
      const wasPinned = pinned();
      items(c).append(t.li);
      scrollDown(wasPinned);
    }
    if (typeof u.title === "string" && u.title) t.title = u.title;
    if (typeof u.status === "string" && u.status) t.status = u.status;
    drawTool(t, id);
  }

  // ---- start

  window.tether = window.tether || {};
  window.tether.chat = {
    state: () => conn,
    view: () => view,
    session: () => (cur ? { key: cur.key, sid: cur.sid, epoch: cur.epoch, seq: cur.seq, running: cur.running, synced: cur.synced } : null),
    catchUp: () => lastCatchUp,
    retry: () => pendingRetry,
    retries: () => retryLog.slice(),
    listRefreshes: () => listRefreshes,
    pushSubscribed: () => pushSubscribed,
    backoffDelay,
  };

  // A share link (tether share session KEY) opens that chat in the chat
  // view: ?session=KEY, taken off the address as the token is.
  function takeSessionParam() {
    const url = new URL(location.href);
    const key = url.searchParams.get("session");
    if (key === null) return null;
    url.searchParams.delete("session");
    url.searchParams.delete("view");
    history.replaceState(history.state, "", url.pathname + url.search + url.hash);
    return validKey(key);
  }

  const linked = takeSessionParam();
  const startKey = linked || validKey(load(tab, TAB_CHAT_KEY)) || validKey(load(local, CHAT_KEY));
  if (startKey) openChat(startKey, false);
  else newChat();
  const startView = linked ? "chat" : load(tab, TAB_VIEW_KEY) || load(local, VIEW_KEY);
  setView(startView === "chat" ? "chat" : "terminal", false);
  if (view === "chat") focusChat();
})();
