// An ACP client scenario runner on the official SDK (2.4.0): `acp.client()`
// connected with `createWebSocketStream` from
// `@agentclientprotocol/sdk/experimental/ws-client`, with the `ws` package
// as the WebSocket (node 20 has none built in). It is what an unmodified ACP
// client does against tether's `GET /acp`; the Go tests in testing/e2e run
// it and assert on what it prints.
//
// Usage: node client.mjs SCENARIO URL [flags]
//   URL is ws://HOST:PORT/acp, or http://HOST:PORT/acp for the SDK's
//   Streamable HTTP client (`createHttpStream` from
//   `@agentclientprotocol/sdk/experimental/http-client`; then the result's
//   `close` is the end of the SDK's stream, `http` the status of every
//   request it made). The access token comes from the environment
//   (ACP_TEST_TOKEN, never argv) and is sent as `Authorization: Bearer` in
//   the upgrade request (the `ws` constructor's headers option, which the
//   SDK's stream passes through), or as ?token= with --token-in-query.
//
// Scenarios (each run is one connection; every scenario starts with
// initialize; the flags below work in all of them):
//   initialize   initialize only.
//   new          session/new, print the sessionId.
//   prompt       session/new (or bind --session), session/prompt --text, wait
//                for its answer.
//   load         session/load --session: the updates before the response are
//                the replay, then wait for --live N more.
//   resume       session/resume --session [--after N] (as
//                _meta["tether/after"]), then wait for --live N.
//   permission   bind, optionally prompt, answer session/request_permission
//                as --permission says, report $/cancel_request.
//   cancel       bind, prompt (default "slow"), session/cancel after
//                --cancel-after N updates (default 1), wait for the answer.
//   list         session/list.
//
// Flags:
//   --session ID       bind to ID (load, unless the scenario binds by resume)
//   --bind load|resume how to bind --session (default: the scenario's)
//   --after N          session/resume's _meta["tether/after"]
//   --text TEXT        the prompt (scenarios prompt/cancel; any with it)
//   --blocks-file F    the same, read from the file F (for blocks too big
//                      for a command line)
//   --blocks JSON      the prompt's content blocks, a JSON array sent as it
//                      is (after the --text block when --text is given too)
//   --cwd DIR          cwd for session/new, load and resume (default: $PWD)
//   --live N           after binding (and the prompt's answer), wait until N
//                      updates arrived after the bind's response
//   --updates N        wait until N updates arrived in all (replay or live)
//   --until-text STR   wait until an update whose text contains STR arrived
//   --cancel-after N   send session/cancel after N updates since the prompt
//   --drop-after N     after N updates since the bind, print the result and
//                      exit at once: the socket is dropped with no close frame
//   --permission allow|deny|cancelled|silent
//                      answer permission requests with that option, the
//                      cancelled outcome, or not at all (default: silent)
//   --after-cancel error|none|answer:OPTION
//                      what a silent client does when a request it holds is
//                      withdrawn by $/cancel_request: answer with the error the
//                      SDK makes of the abort (-32800), never answer, or send
//                      a late result selecting OPTION (default: error)
//   --wait-permission  wait until a permission request arrived
//   --wait-cancel-request  wait until a $/cancel_request arrived (and was
//                      handled per --after-cancel)
//   --send-cancel      after the waits, send session/cancel for the session
//                      (e.g. to end a turn another client started)
//   --token-in-query   send the token as ?token= instead of the header
//   --timeout MS       give up after MS (default 30000): the result is printed
//                      with "timedOut": true and the exit code is 3
//
// Output: one JSON object on stdout (see `result` below): the initialize
// result, the bind and prompt responses, every session/update in arrival
// order with its _meta["tether/seq"] as it was on the wire ("seq") and as
// the SDK handed it to the handler ("sdkSeq"), the phase it arrived in
// ("replay": before the bind's response, "live": after), the permission
// requests and what became of them, the $/cancel_request notifications, the
// socket's close code, and the raw trace of every frame in and out.
// Progress goes to stderr as lines `PHASE {"phase":NAME,…}` (initialized,
// bound, prompt-sent, update, permission, cancel-request, answered, stop),
// which the Go tests wait on to order several clients; other stderr lines
// are diagnostics.
import * as fs from "node:fs";
import * as acp from "@agentclientprotocol/sdk";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";
import WebSocket from "ws";

const [scenario, rawURL, ...rest] = process.argv.slice(2);
const SCENARIOS = ["initialize", "new", "prompt", "load", "resume", "permission", "cancel", "list"];
if (!SCENARIOS.includes(scenario) || !rawURL) {
  process.stderr.write(`usage: node client.mjs ${SCENARIOS.join("|")} URL [flags]\n`);
  process.exit(2);
}
const flags = parseFlags(rest);
const start = Date.now();

function parseFlags(argv) {
  const f = {
    session: "",
    bind: "",
    after: undefined,
    text: undefined,
    cwd: process.cwd(),
    live: 0,
    updates: 0,
    untilText: "",
    cancelAfter: scenario === "cancel" ? 1 : 0,
    dropAfter: 0,
    permission: "silent",
    afterCancel: "error",
    waitPermission: false,
    waitCancelRequest: false,
    sendCancel: false,
    tokenInQuery: false,
    timeout: 30000,
  };
  const num = (v, name) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 0) usage(`${name}: not a count: ${v}`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    switch (a) {
      case "--session": f.session = next(); break;
      case "--bind": f.bind = next(); break;
      case "--after": f.after = num(next(), a); break;
      case "--text": f.text = next(); break;
      case "--blocks": f.blocks = JSON.parse(next()); break;
      case "--blocks-file": f.blocks = JSON.parse(fs.readFileSync(next(), "utf8")); break;
      case "--cwd": f.cwd = next(); break;
      case "--live": f.live = num(next(), a); break;
      case "--updates": f.updates = num(next(), a); break;
      case "--until-text": f.untilText = next(); break;
      case "--cancel-after": f.cancelAfter = num(next(), a); break;
      case "--drop-after": f.dropAfter = num(next(), a); break;
      case "--permission": f.permission = next(); break;
      case "--after-cancel": f.afterCancel = next(); break;
      case "--wait-permission": f.waitPermission = true; break;
      case "--wait-cancel-request": f.waitCancelRequest = true; break;
      case "--send-cancel": f.sendCancel = true; break;
      case "--token-in-query": f.tokenInQuery = true; break;
      case "--timeout": f.timeout = num(next(), a); break;
      default: usage(`unknown flag ${a}`);
    }
  }
  if (!["allow", "deny", "cancelled", "silent"].includes(f.permission)) usage(`--permission ${f.permission}`);
  if (!/^(error|none|answer:.+)$/.test(f.afterCancel)) usage(`--after-cancel ${f.afterCancel}`);
  if (!f.bind) f.bind = scenario === "resume" ? "resume" : "load";
  if (f.text === undefined && f.blocks === undefined && scenario === "prompt") f.text = "hello";
  if (f.text === undefined && scenario === "cancel") f.text = "slow";
  return f;
}

function usage(msg) {
  process.stderr.write(`client.mjs: ${msg}\n`);
  process.exit(2);
}

function phase(name, extra = {}) {
  process.stderr.write(`PHASE ${JSON.stringify({ phase: name, ...extra })}\n`);
}

// The result printed on stdout.
const result = {
  scenario,
  initialize: undefined, // {result} or {error}
  sessionId: flags.session || undefined,
  bind: undefined, // {method, result|error, replayed: updates before the response}
  prompt: undefined, // {stopReason} | {error}
  cancelSent: false,
  list: undefined,
  updates: [], // {seq, sdkSeq, meta, sdkMeta, phase, sessionId, update}
  permissionRequests: [], // {requestId, params, answer, cancelRequested}
  cancelRequests: [], // requestId of every $/cancel_request received
  close: undefined, // {code, reason} once the socket closed
  timedOut: false,
  errors: [], // anything unexpected (not a JSON-RPC error of a call)
  frames: [], // {t, dir, msg}: every message in and out, in order
};

// A wakeup for the waits: every change calls poke().
let waiters = [];
function poke() {
  for (const w of waiters.splice(0)) w();
}
async function waitUntil(cond) {
  while (!cond()) {
    await new Promise((resolve) => waiters.push(resolve));
  }
}

// The WebSocket constructor given to the SDK: ws, with the close code kept.
let socket; // the one TracedWebSocket the SDK made
class TracedWebSocket extends WebSocket {
  constructor(url, protocols, options) {
    super(url, protocols, options);
    socket = this;
    this.on("close", (code, reason) => {
      result.close = { code, reason: reason.toString() };
      poke();
    });
    // With this listener ws leaves the request open: end it, so that the
    // SDK's stream errors and every pending call fails at once.
    this.on("unexpected-response", (req, res) => {
      result.upgradeStatus = res.statusCode;
      result.errors.push(`upgrade answered HTTP ${res.statusCode}`);
      res.resume();
      req.destroy(new Error(`upgrade answered HTTP ${res.statusCode}`));
      poke();
    });
  }
}

const url = new URL(rawURL);
const token = process.env.ACP_TEST_TOKEN ?? "";
const headers = {};
if (token && flags.tokenInQuery) url.searchParams.set("token", token);
else if (token) headers.Authorization = `Bearer ${token}`;
const overHTTP = url.protocol === "http:" || url.protocol === "https:";
// Over HTTP, every request the SDK makes is recorded (method, session
// header, status) and the end of its stream is the "close".
result.http = overHTTP ? [] : undefined;
const tracedFetch = async (input, init) => {
  const h = new Headers(init?.headers);
  const rec = { method: init?.method ?? "GET", session: h.get("Acp-Session-Id") ?? undefined, accept: h.get("Accept") ?? undefined };
  result.http.push(rec);
  try {
    const res = await fetch(input, init);
    rec.status = res.status;
    return res;
  } catch (err) {
    rec.error = String(err?.message ?? err);
    throw err;
  }
};
const ws = overHTTP
  ? endTracked(createHttpStream(url.toString(), { headers, fetch: tracedFetch }))
  : createWebSocketStream(url.toString(), { WebSocket: TracedWebSocket, headers });

// endTracked records the end of an HTTP stream's readable side as
// result.close (code null), as the WebSocket's close event does.
function endTracked(s) {
  const reader = s.readable.getReader();
  return {
    writable: s.writable,
    readable: new ReadableStream({
      async pull(controller) {
        try {
          const { value, done } = await reader.read();
          if (done) {
            result.close ??= { code: null, reason: "stream ended" };
            poke();
            controller.close();
            return;
          }
          controller.enqueue(value);
        } catch (err) {
          result.close ??= { code: null, reason: String(err?.message ?? err) };
          poke();
          controller.error(err);
        }
      },
    }),
  };
}

// Tap both directions: the raw trace, the ids of our own requests, and the
// arrival order of updates relative to the bind's response.
let bindRequestId; // id of our session/load or session/resume request
let bindAnswered = false; // its response has arrived (raw order)
let liveSincePrompt = 0;
const stream = {
  readable: ws.readable.pipeThrough(
    new TransformStream({
      transform(msg, controller) {
        result.frames.push({ t: Date.now() - start, dir: "in", msg });
        onIncoming(msg);
        controller.enqueue(msg);
      },
    }),
  ),
  writable: new WritableStream({
    async write(msg) {
      result.frames.push({ t: Date.now() - start, dir: "out", msg });
      if (msg.method === "session/load" || msg.method === "session/resume") bindRequestId = msg.id;
      await writeOut(msg);
      if (!("method" in msg)) {
        const rec = result.permissionRequests.find((r) => r.requestId === msg.id);
        if (rec) rec.answerSent = true;
        poke();
      }
    },
    close() {
      return closeOut();
    },
  }),
};

// Writes to the SDK's stream go one at a time, each holding its writer's
// lock; closeOut (once, whoever asks) waits for the last one first: a
// close while a write held the lock failed with "WritableStream is
// locked".
let lastWrite = Promise.resolve();
function writeOut(msg) {
  const p = lastWrite.then(async () => {
    const w = ws.writable.getWriter();
    try {
      await w.write(msg);
    } finally {
      w.releaseLock();
    }
  });
  lastWrite = p.catch(() => {});
  return p;
}
let closing;
function closeOut() {
  closing ??= (async () => {
    await lastWrite;
    const w = ws.writable.getWriter();
    try {
      await w.close();
    } finally {
      w.releaseLock();
    }
  })();
  return closing;
}

function onIncoming(msg) {
  if (msg.method === "session/update") {
    const p = msg.params ?? {};
    const entry = {
      seq: p._meta?.["tether/seq"] ?? null,
      sdkSeq: undefined,
      meta: p._meta ?? null,
      sdkMeta: undefined,
      phase: bindRequestId !== undefined && !bindAnswered ? "replay" : "live",
      sessionId: p.sessionId,
      update: p.update,
    };
    result.updates.push(entry);
    if (entry.phase === "live") liveSincePrompt++;
    phase("update", { n: result.updates.length, seq: entry.seq, as: entry.phase });
    maybeCancel();
    maybeDrop();
  } else if (msg.method === "$/cancel_request") {
    result.cancelRequests.push(msg.params?.requestId);
    phase("cancel-request", { requestId: msg.params?.requestId });
  } else if (!("method" in msg) && msg.id === bindRequestId && bindRequestId !== undefined) {
    bindAnswered = true;
  }
  poke();
}

// The SDK's view of each update, matched to the raw one by arrival order.
let sdkIndex = 0;
function onSdkUpdate(params) {
  const entry = result.updates[sdkIndex++];
  if (entry) {
    entry.sdkSeq = params._meta?.["tether/seq"] ?? null;
    entry.sdkMeta = params._meta ?? null;
  }
  else result.errors.push("the SDK delivered an update the socket did not carry");
  poke();
}

let cancelTarget; // session to cancel once enough updates arrived
function maybeCancel() {
  if (!cancelTarget || result.cancelSent || flags.cancelAfter === 0) return;
  if (liveSincePrompt >= flags.cancelAfter) {
    result.cancelSent = true;
    void agentCx.notify(acp.methods.agent.session.cancel, { sessionId: cancelTarget }).catch((e) => result.errors.push(`session/cancel: ${e}`));
  }
}

let dropArmed = false;
function maybeDrop() {
  if (!dropArmed || flags.dropAfter === 0) return;
  const live = result.updates.filter((u) => u.phase === "live").length;
  if (live >= flags.dropAfter) {
    finish(0, { drop: true });
  }
}

let finished = false;
function finish(code, { drop = false } = {}) {
  if (finished) return;
  finished = true;
  result.dropped = drop || undefined;
  process.stdout.write(JSON.stringify(result) + "\n", () => {
    // A drop: exit with the socket open, so it ends without a close frame.
    process.exit(code);
  });
}

function errorOf(err) {
  if (err instanceof acp.RequestError) return { code: err.code, message: err.message, data: err.data ?? null };
  return { code: null, message: String(err?.message ?? err), data: null };
}

const permissionPending = [];
const app = acp
  .client({ name: "tether-acp-test-client" })
  .onNotification(acp.methods.client.session.update, ({ params }) => onSdkUpdate(params))
  .onRequest(acp.methods.client.session.requestPermission, async ({ params, requestId, signal }) => {
    const rec = { requestId, params, answer: undefined, answerSent: false, cancelRequested: false };
    result.permissionRequests.push(rec);
    phase("permission", { requestId });
    poke();
    const answer = (outcome) => {
      rec.answer = outcome;
      phase("answered", { requestId, outcome });
      poke();
      return { outcome };
    };
    if (flags.permission === "allow" || flags.permission === "deny") {
      return answer({ outcome: "selected", optionId: flags.permission });
    }
    if (flags.permission === "cancelled") {
      return answer({ outcome: "cancelled" });
    }
    // silent: hold the request until it is withdrawn.
    await new Promise((resolve) => {
      if (signal.aborted) resolve();
      else signal.addEventListener("abort", resolve, { once: true });
    });
    // The abort is a $/cancel_request only if one arrived (the raw tap saw
    // it before the SDK acted on it); else the connection is closing.
    rec.cancelRequested = result.cancelRequests.includes(requestId);
    poke();
    if (flags.afterCancel === "none") {
      permissionPending.push(rec);
      rec.answer = "none";
      poke();
      return new Promise(() => {});
    }
    if (flags.afterCancel.startsWith("answer:")) {
      return answer({ outcome: "selected", optionId: flags.afterCancel.slice("answer:".length) });
    }
    rec.answer = { error: errorOf(signal.reason) };
    phase("answered", { requestId, error: rec.answer.error });
    poke();
    throw signal.reason;
  })
  .onNotification("*", ({ method, params }) => {
    if (method !== "$/cancel_request") result.errors.push(`unexpected notification ${method} ${JSON.stringify(params)}`);
  })
  .onRequest("*", ({ method }) => {
    result.errors.push(`unexpected request ${method}`);
    throw acp.RequestError.methodNotFound(method);
  });

const conn = app.connect(stream);
const agentCx = conn.agent;
const timer = setTimeout(() => {
  result.timedOut = true;
  finish(3);
}, flags.timeout);
timer.unref();

async function call(method, params) {
  try {
    return { result: await agentCx.request(method, params) };
  } catch (err) {
    return { error: errorOf(err) };
  }
}

try {
  result.initialize = await call(acp.methods.agent.initialize, {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
    clientInfo: { name: "tether-acp-test-client", version: "1.0.0" },
  });
  phase("initialized");
  if (result.initialize.error || scenario === "initialize") {
    await done();
  }

  if (scenario === "list") {
    result.list = await call(acp.methods.agent.session.list, {});
    await done();
  }

  // Bind: a new session, or load/resume of --session.
  if (!flags.session) {
    const r = await call(acp.methods.agent.session.new, { cwd: flags.cwd, mcpServers: [] });
    result.bind = { method: "session/new", ...r, replayed: 0 };
    result.sessionId = r.result?.sessionId;
  } else {
    const method = flags.bind === "resume" ? acp.methods.agent.session.resume : acp.methods.agent.session.load;
    const params = { sessionId: flags.session, cwd: flags.cwd, mcpServers: [] };
    if (flags.after !== undefined) params._meta = { "tether/after": flags.after };
    const r = await call(method, params);
    result.bind = { method, ...r, replayed: result.updates.filter((u) => u.phase === "replay").length };
  }
  phase("bound", { sessionId: result.sessionId, error: result.bind.error });
  dropArmed = true;
  maybeDrop();
  if (result.bind.error || scenario === "new") {
    await done();
  }

  if (flags.text !== undefined || flags.blocks !== undefined) {
    cancelTarget = result.sessionId;
    liveSincePrompt = 0;
    const prompt = flags.text !== undefined ? [{ type: "text", text: flags.text }] : [];
    const p = agentCx.request(acp.methods.agent.session.prompt, {
      sessionId: result.sessionId,
      prompt: prompt.concat(flags.blocks ?? []),
    });
    phase("prompt-sent");
    try {
      const r = await p;
      result.prompt = { stopReason: r.stopReason, meta: r._meta };
    } catch (err) {
      result.prompt = { error: errorOf(err) };
    }
    phase("stop", result.prompt);
  }

  const liveCount = () => result.updates.filter((u) => u.phase === "live").length;
  // The waits end early when the socket closed: the result tells.
  await waitUntil(
    () =>
      result.close !== undefined ||
      (liveCount() >= flags.live &&
        result.updates.length >= flags.updates &&
      (!flags.untilText || result.updates.some((u) => textOf(u.update).includes(flags.untilText))) &&
      (!flags.waitPermission || result.permissionRequests.length > 0) &&
      (!flags.waitCancelRequest ||
        result.permissionRequests.some((r) => r.cancelRequested && (r.answerSent || r.answer === "none")))),
  );
  if (flags.sendCancel && result.close === undefined) {
    await agentCx.notify(acp.methods.agent.session.cancel, { sessionId: result.sessionId });
    result.cancelSent = true;
  }
  await done();
} catch (err) {
  result.errors.push(`exception: ${err?.stack ?? err}`);
  finish(1);
}

function textOf(update) {
  const c = update?.content;
  return c && !Array.isArray(c) && c.type === "text" ? c.text : "";
}

// done lets the SDK finish delivering what already arrived, closes the
// socket with a close frame (waiting up to 2 s for the server's answer),
// prints the result and exits.
async function done() {
  await waitUntil(() => sdkIndex >= result.updates.length || result.close !== undefined);
  if (result.close === undefined && overHTTP) {
    // The SDK's close: DELETE /acp with the connection id.
    await closeOut().catch((err) => result.errors.push(`close: ${err?.message ?? err}`));
  } else if (result.close === undefined && socket) {
    socket.close(1000);
    let expired = false;
    const bound = setTimeout(() => {
      expired = true;
      poke();
    }, 2000);
    await waitUntil(() => result.close !== undefined || expired);
    clearTimeout(bound);
  }
  finish(0);
  await new Promise(() => {});
}
