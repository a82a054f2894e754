// A deterministic ACP agent for tether's tests, written with the official
// SDK (@agentclientprotocol/sdk, `acp.agent()` over `ndJsonStream` on
// stdio). tether runs it with `--agent acp --agent-command 'node agent.mjs …'`.
//
// Usage: node agent.mjs [--dir DIR] [--log FILE] [--no-load] [--prompt-caps CAPS]
//   --dir DIR   sessions are kept in DIR/sessions.json, so a restarted agent
//               process can still session/load them (env ACP_TEST_AGENT_DIR;
//               default: a new temporary directory, i.e. nothing survives).
//   --log FILE  every JSON-RPC message this process receives (and sends) is
//               appended to FILE as one JSON line (env ACP_TEST_AGENT_LOG).
//   --no-load   advertise loadSession false and leave session/load
//               unimplemented (env ACP_TEST_AGENT_NO_LOAD=1).
//   --prompt-caps CAPS  advertise these promptCapabilities, a comma-separated
//               list of image, audio, embeddedContext (env
//               ACP_TEST_AGENT_PROMPT_CAPS; default none). The log shows the
//               blocks each session/prompt brought.
// (tether passes no TETHER_* variable to an agent, hence the ACP_TEST_ names.)
//
// Log lines: {"t":MS,"pid":PID,"dir":"in"|"out","kind":"request"|
// "notification"|"response","id"?,"method"?,"params"?,"result"?,"error"?},
// plus {"dir":"event","event":"start"|"exit",...} at start and exit.
//
// Every session/update carries _meta {"agent/n": N} in its params (N counts
// the updates this process sent).
//
// Sessions: session/new returns a fresh id ("sess-" + a UUID). Every update
// the agent emits, and each prompt as a user_message_chunk, is kept in the
// session's history; session/load of a known id replays that history as
// session/update notifications before it answers (as ACP agents do), an
// unknown id is -32002. A session must be created or loaded by *this*
// process before it can be prompted: a prompt for any other id is -32002, so
// after a restart the client has to session/load.
//
// Prompt mini-language (the text of the prompt's text blocks, split into
// words at white space):
//   chunks N [delay MS]  N agent_message_chunk updates "c1 " … "cN ", MS ms
//                        apart (default 0); stopReason end_turn.
//   tool                 a tool_call (id "tool-<turn>", status pending) then a
//                        tool_call_update (status completed) and a chunk
//                        "tool done"; end_turn.
//   permission           a tool_call, then session/request_permission with the
//                        options allow (allow_once) and deny (reject_once);
//                        when the answer comes: a chunk "chose:<optionId>"
//                        ("chose:cancelled" for the cancelled outcome) and
//                        end_turn (cancelled when session/cancel came). The
//                        request waits for its answer as long as it takes.
//   withdraw [MS]        like permission, but the agent withdraws its request
//                        with $/cancel_request MS ms (default 0) after sending
//                        it, then waits for whatever the client answers and
//                        reports it as a chunk "withdrawn:<optionId>",
//                        "withdrawn:cancelled" or "withdrawn:error:<code>".
//   crash                one chunk "c1 ", then the process exits (code 3)
//                        in the middle of the turn.
//   fail                 one chunk "c1 ", then the prompt is answered with a
//                        JSON-RPC error (-32603, data.reason "fail requested").
//   slow [MS]            chunks "s1 ", "s2 ", … every MS ms (default 50) until
//                        the turn is cancelled.
//   bench N [delay MS]   for benchmarks: N agent_message_chunk updates "b1 " …
//                        "bN ", MS ms apart (default 0), each with the time it
//                        was sent in the update's own _meta: {"agent/t": MS}, a
//                        CLOCK_MONOTONIC reading in ms with a ns fraction
//                        (process.hrtime), so a client on the same machine can
//                        subtract it from its own reading. The history is
//                        written once at the end of the turn (not once per
//                        update, which costs O(N) per update), so session/load
//                        still replays it; end_turn.
//   anything else        echoed back, exactly, as one agent_message_chunk.
// session/cancel (or $/cancel_request for the prompt) ends the turn in flight
// at its next step with stopReason cancelled.
import * as acp from "@agentclientprotocol/sdk";
import { randomUUID } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Readable, Writable } from "node:stream";

const opts = parseArgs(process.argv.slice(2));
const sessionsFile = path.join(opts.dir, "sessions.json");
const PERMISSION_OPTIONS = [
  { optionId: "allow", name: "Allow", kind: "allow_once" },
  { optionId: "deny", name: "Deny", kind: "reject_once" },
];

function parseArgs(argv) {
  const o = {
    dir: process.env.ACP_TEST_AGENT_DIR || "",
    log: process.env.ACP_TEST_AGENT_LOG || "",
    noLoad: process.env.ACP_TEST_AGENT_NO_LOAD === "1",
    promptCaps: process.env.ACP_TEST_AGENT_PROMPT_CAPS || "",
  };
  for (let i = 0; i < argv.length; i++) {
    switch (argv[i]) {
      case "--dir":
        o.dir = argv[++i];
        break;
      case "--log":
        o.log = argv[++i];
        break;
      case "--no-load":
        o.noLoad = true;
        break;
      case "--prompt-caps":
        o.promptCaps = argv[++i];
        break;
      default:
        process.stderr.write(`agent.mjs: unknown argument ${argv[i]}\n`);
        process.exit(2);
    }
  }
  if (!o.dir) {
    o.dir = fs.mkdtempSync(path.join(os.tmpdir(), "acp-test-agent-"));
  }
  fs.mkdirSync(o.dir, { recursive: true });
  return o;
}

// log appends one line to the log synchronously, so that nothing is lost
// when the process exits on purpose (crash) or is killed.
function log(entry) {
  if (!opts.log) return;
  fs.appendFileSync(opts.log, JSON.stringify({ t: Date.now(), pid: process.pid, ...entry }) + "\n");
}

function logMessage(dir, msg) {
  const e = { dir };
  if ("method" in msg) {
    e.kind = "id" in msg ? "request" : "notification";
    e.method = msg.method;
    if ("id" in msg) e.id = msg.id;
    if ("params" in msg) e.params = msg.params;
  } else {
    e.kind = "response";
    e.id = msg.id;
    if ("result" in msg) e.result = msg.result;
    if ("error" in msg) e.error = msg.error;
  }
  log(e);
}

// The stored sessions: id → {cwd, history: [update…]}.
function readStore() {
  try {
    return JSON.parse(fs.readFileSync(sessionsFile, "utf8"));
  } catch (err) {
    if (err.code === "ENOENT") return {};
    throw err;
  }
}

function writeStore(store) {
  const tmp = `${sessionsFile}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, JSON.stringify(store));
  fs.renameSync(tmp, sessionsFile);
}

function appendHistory(sessionId, update) {
  const store = readStore();
  store[sessionId].history.push(update);
  writeStore(store);
}

// Live state of this process.
const loaded = new Set(); // session ids created or loaded by this process
const turns = new Map(); // session id → the turn in flight
let turnCounter = 0;

const sleep = (ms, turn) =>
  new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    turn.wake.add(done);
    function done() {
      clearTimeout(timer);
      turn.wake.delete(done);
      resolve();
    }
  });

function cancelTurn(turn) {
  if (!turn || turn.cancelled) return;
  turn.cancelled = true;
  for (const wake of [...turn.wake]) wake();
}

// notify sends one session/update; its params carry _meta {"agent/n": N},
// N counting this process's updates, so a test can see whether _meta
// survives the way to the client.
let notified = 0;
function notify(client, sessionId, update) {
  return client.notify(acp.methods.client.session.update, { sessionId, update, _meta: { "agent/n": ++notified } });
}

async function emit(client, sessionId, update) {
  appendHistory(sessionId, update);
  await notify(client, sessionId, update);
}

const text = (t) => ({ type: "text", text: t });
// monotonicMS is CLOCK_MONOTONIC in ms (with a ns fraction): one clock for
// every process on the machine, unlike performance.timeOrigin.
const monotonicMS = () => Number(process.hrtime.bigint()) / 1e6;
const chunk = (t) => ({ sessionUpdate: "agent_message_chunk", content: text(t) });

function promptText(prompt) {
  return prompt
    .filter((b) => b.type === "text")
    .map((b) => b.text)
    .join("");
}

async function runTurn(client, sessionId, turn, prompt) {
  const [cmd, ...args] = prompt.trim().split(/\s+/);
  switch (cmd) {
    case "chunks": {
      const n = Number(args[0] ?? 1);
      const delay = args[1] === "delay" ? Number(args[2] ?? 0) : 0;
      for (let i = 1; i <= n; i++) {
        if (turn.cancelled) return "cancelled";
        if (i > 1 && delay > 0) await sleep(delay, turn);
        if (turn.cancelled) return "cancelled";
        await emit(client, sessionId, chunk(`c${i} `));
      }
      return turn.cancelled ? "cancelled" : "end_turn";
    }
    case "tool": {
      const toolCallId = `tool-${turn.n}`;
      await emit(client, sessionId, {
        sessionUpdate: "tool_call",
        toolCallId,
        title: "test tool",
        kind: "execute",
        status: "pending",
      });
      await emit(client, sessionId, {
        sessionUpdate: "tool_call_update",
        toolCallId,
        status: "completed",
        content: [{ type: "content", content: text("tool output") }],
      });
      await emit(client, sessionId, chunk("tool done"));
      return turn.cancelled ? "cancelled" : "end_turn";
    }
    case "permission": {
      const toolCallId = `tool-${turn.n}`;
      const toolCall = { toolCallId, title: "needs permission", kind: "edit", status: "pending" };
      await emit(client, sessionId, { sessionUpdate: "tool_call", ...toolCall });
      const answer = await client.request(acp.methods.client.session.requestPermission, {
        sessionId,
        toolCall,
        options: PERMISSION_OPTIONS,
      });
      const outcome = answer?.outcome;
      const chose = outcome?.outcome === "selected" ? outcome.optionId : "cancelled";
      await emit(client, sessionId, chunk(`chose:${chose}`));
      return turn.cancelled ? "cancelled" : "end_turn";
    }
    case "withdraw": {
      const toolCallId = `tool-${turn.n}`;
      const toolCall = { toolCallId, title: "needs permission", kind: "edit", status: "pending" };
      await emit(client, sessionId, { sessionUpdate: "tool_call", ...toolCall });
      const withdraw = new AbortController();
      const answer = client.request(
        acp.methods.client.session.requestPermission,
        { sessionId, toolCall, options: PERMISSION_OPTIONS },
        { cancellationSignal: withdraw.signal },
      );
      await sleep(Number(args[0] ?? 0), turn);
      withdraw.abort();
      let what;
      try {
        const res = await answer;
        what = res?.outcome?.outcome === "selected" ? res.outcome.optionId : "cancelled";
      } catch (err) {
        what = `error:${err?.code ?? err}`;
      }
      await emit(client, sessionId, chunk(`withdrawn:${what}`));
      return turn.cancelled ? "cancelled" : "end_turn";
    }
    case "crash": {
      await emit(client, sessionId, chunk("c1 "));
      log({ dir: "event", event: "exit", reason: "crash requested" });
      process.exit(3);
    }
    // falls through: never reached
    case "fail": {
      await emit(client, sessionId, chunk("c1 "));
      throw new acp.RequestError(-32603, "Internal error", { reason: "fail requested" });
    }
    case "bench": {
      const n = Number(args[0] ?? 1);
      const delay = args[1] === "delay" ? Number(args[2] ?? 0) : 0;
      const history = [];
      try {
        for (let i = 1; i <= n; i++) {
          if (turn.cancelled) return "cancelled";
          if (i > 1 && delay > 0) await sleep(delay, turn);
          if (turn.cancelled) return "cancelled";
          const update = { ...chunk(`b${i} `), _meta: { "agent/t": monotonicMS() } };
          history.push(update);
          await notify(client, sessionId, update);
        }
      } finally {
        const store = readStore();
        store[sessionId].history.push(...history);
        writeStore(store);
      }
      return turn.cancelled ? "cancelled" : "end_turn";
    }
    case "slow": {
      const every = Number(args[0] ?? 50);
      for (let i = 1; !turn.cancelled; i++) {
        await emit(client, sessionId, chunk(`s${i} `));
        await sleep(every, turn);
      }
      return "cancelled";
    }
    default:
      await emit(client, sessionId, chunk(prompt));
      return turn.cancelled ? "cancelled" : "end_turn";
  }
}

const app = acp
  .agent({ name: "tether-test-agent" })
  .onRequest(acp.methods.agent.initialize, () => ({
    protocolVersion: acp.PROTOCOL_VERSION,
    agentCapabilities: {
      loadSession: !opts.noLoad,
      promptCapabilities: Object.fromEntries(
        ["image", "audio", "embeddedContext"].map((c) => [c, opts.promptCaps.split(",").includes(c)]),
      ),
      sessionCapabilities: { list: {} },
    },
    agentInfo: { name: "tether-test-agent", version: "1.0.0" },
    authMethods: [],
  }))
  .onRequest(acp.methods.agent.session.new, ({ params }) => {
    const sessionId = `sess-${randomUUID()}`;
    const store = readStore();
    store[sessionId] = { cwd: params.cwd, history: [] };
    writeStore(store);
    loaded.add(sessionId);
    return { sessionId };
  })
  .onRequest(acp.methods.agent.session.list, () => {
    const store = readStore();
    return {
      sessions: Object.entries(store).map(([sessionId, s]) => ({ sessionId, cwd: s.cwd })),
    };
  })
  .onRequest(acp.methods.agent.session.prompt, async ({ params, client, signal }) => {
    const { sessionId } = params;
    if (!loaded.has(sessionId)) {
      throw acp.RequestError.sessionNotFound(sessionId);
    }
    if (turns.has(sessionId)) {
      throw new acp.RequestError(-32600, "Invalid request", { reason: "a turn is already in flight" });
    }
    const turn = { n: ++turnCounter, cancelled: false, wake: new Set() };
    turns.set(sessionId, turn);
    const onAbort = () => cancelTurn(turn);
    signal.addEventListener("abort", onAbort);
    try {
      const t = promptText(params.prompt);
      appendHistory(sessionId, { sessionUpdate: "user_message_chunk", content: text(t) });
      const stopReason = await runTurn(client, sessionId, turn, t);
      return { stopReason };
    } finally {
      signal.removeEventListener("abort", onAbort);
      turns.delete(sessionId);
    }
  })
  .onNotification(acp.methods.agent.session.cancel, ({ params }) => {
    cancelTurn(turns.get(params.sessionId));
  });

if (!opts.noLoad) {
  app.onRequest(acp.methods.agent.session.load, async ({ params, client }) => {
    const s = readStore()[params.sessionId];
    if (!s) {
      throw acp.RequestError.sessionNotFound(params.sessionId);
    }
    for (const update of s.history) {
      await notify(client, params.sessionId, update);
    }
    loaded.add(params.sessionId);
    return {};
  });
}

// The stdio stream, tapped so that every message in and out is logged.
const stdio = acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
const stream = {
  readable: stdio.readable.pipeThrough(
    new TransformStream({
      transform(msg, controller) {
        logMessage("in", msg);
        controller.enqueue(msg);
      },
    }),
  ),
  writable: new WritableStream({
    async write(msg) {
      logMessage("out", msg);
      const w = stdio.writable.getWriter();
      try {
        await w.write(msg);
      } finally {
        w.releaseLock();
      }
    },
  }),
};

log({ dir: "event", event: "start", argv: process.argv.slice(2), loadSession: !opts.noLoad });
process.stderr.write(`tether test agent started (pid ${process.pid})\n`);
const connection = app.connect(stream);
await connection.closed;
log({ dir: "event", event: "exit", reason: "stdin closed" });
process.exit(0);
