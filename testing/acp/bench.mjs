// An ACP benchmark client on the official SDK (2.4.0), connected exactly as
// client.mjs is (`acp.client()` over `createWebSocketStream` from
// `@agentclientprotocol/sdk/experimental/ws-client`, `ws` as the
// WebSocket), against tether's `GET /acp` or relay.mjs, with agent.mjs
// behind either. bench/cmd/tetherbench's `acp` row runs it.
//
// Usage: node bench.mjs URL [flags]   (token in ACP_TEST_TOKEN, sent as
//                                      Authorization: Bearer)
//   --warmup N     first, on session A: prompt `bench N` (default 200), not
//                  measured (the JIT, the first allocations).
//   --paced N      latency phase, session A: prompt `bench N delay MS`
//                  (default 300): latency of update i = the client's
//                  CLOCK_MONOTONIC reading when the SDK hands it to the
//                  session/update handler − the agent's reading in the
//                  update's _meta["agent/t"] when it sent it.
//   --delay MS     the latency phase's pacing (default 5), so that latency
//                  is not queueing.
//   --updates N    throughput phase, a new session B: N updates (default
//                  10000), unpaced, as prompts of `bench K` (--burst) sent one
//                  after the other: updates/s from sending the first prompt to
//                  the last prompt's response, and while streaming (each
//                  prompt's first update to its last, summed).
//   --burst K      updates per prompt of the throughput phase (default 1000).
//   --load         load phase: close the socket, open a new connection,
//                  initialize, session/load of B: the time from sending it to
//                  its response and to the first replayed update; the replay
//                  (the updates before the response) must be B's prompts as
//                  user_message_chunk updates and their chunks, in order:
//                  "complete" says whether it was, "problems" what was not
//                  (measured, not an error).
//   --single N     last, on a new session C: one prompt `bench N`, unpaced;
//                  reports whether it completed and how many updates came
//                  (0: skipped). Not an error when it fails: it is measured.
//   --timeout MS   give up after MS (default 120000): exit code 3.
//
// Every phase checks what arrived: the count, the texts "b1 " … in order,
// each with its _meta["agent/t"]; a mismatch is an error (exit code 1).
// Output: one JSON line on stdout (see `result` below). Progress goes to
// stderr as lines `PHASE {"phase":NAME,"t":MS}` (warmup, paced, throughput,
// throughput-end, load, load-end, single, single-end, done), at which the
// harness reads the CPU time of the processes on both sides.
import * as acp from "@agentclientprotocol/sdk";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import WebSocket from "ws";

const [rawURL, ...rest] = process.argv.slice(2);
if (!rawURL) usage("no URL");
const flags = parseFlags(rest);
const monotonicMS = () => Number(process.hrtime.bigint()) / 1e6;

function parseFlags(argv) {
  const f = { warmup: 200, paced: 300, delay: 5, updates: 10000, burst: 1000, load: false, single: 0, timeout: 120000 };
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
      case "--warmup": f.warmup = num(next(), a); break;
      case "--paced": f.paced = num(next(), a); break;
      case "--delay": f.delay = num(next(), a); break;
      case "--updates": f.updates = num(next(), a); break;
      case "--burst": f.burst = num(next(), a); break;
      case "--load": f.load = true; break;
      case "--single": f.single = num(next(), a); break;
      case "--timeout": f.timeout = num(next(), a); break;
      default: usage(`unknown flag ${a}`);
    }
  }
  if (f.burst === 0) usage("--burst must be at least 1");
  return f;
}

function usage(msg) {
  process.stderr.write(`bench.mjs: ${msg}\nusage: node bench.mjs URL [--warmup N] [--paced N] [--delay MS] [--updates N] [--burst K] [--load] [--single N] [--timeout MS]\n`);
  process.exit(2);
}

function phase(name) {
  process.stderr.write(`PHASE ${JSON.stringify({ phase: name, t: monotonicMS() })}\n`);
}

// The result printed on stdout. Times in ms.
const result = {
  url: rawURL.replace(/token=[^&]*/, "token=…"),
  flags,
  latency: undefined, // {n, ms: [latency of each update, in arrival order], sent: [its agent/t]}
  throughput: undefined, // {n, prompts, totalMS, updatesPerSec, streamingPerSec, bursts: [{n, promptMS, firstUpdateMS, agentStartMS, firstToLastMS, agentFirstToLastMS}]}
  load: undefined, // {responseMS, firstUpdateMS, replayed, userChunks, agentChunks, complete, problems}
  single: undefined, // {n, completed, received, stopReason|error, promptMS}
  errors: [],
};

const token = process.env.ACP_TEST_TOKEN ?? "";

// connect opens one SDK client connection; onUpdate gets (params, t) for
// every session/update in the SDK's order, t when the handler ran; the raw
// tap counts the updates that arrived before the response to a request
// (replayedBefore).
function connect(onUpdate) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  let socket;
  class KeptWebSocket extends WebSocket {
    constructor(url, protocols, options) {
      super(url, protocols, options);
      socket = this;
    }
  }
  const ws = createWebSocketStream(rawURL, { WebSocket: KeptWebSocket, headers });
  const tap = { watchId: undefined, before: 0, answered: false, firstUpdate: undefined };
  const stream = {
    readable: ws.readable.pipeThrough(
      new TransformStream({
        transform(msg, controller) {
          if (msg.method === "session/update") {
            if (tap.firstUpdate === undefined) tap.firstUpdate = monotonicMS();
            if (tap.watchId !== undefined && !tap.answered) tap.before++;
          } else if (!("method" in msg) && tap.watchId !== undefined && msg.id === tap.watchId) {
            tap.answered = true;
          }
          controller.enqueue(msg);
        },
      }),
    ),
    writable: new WritableStream({
      async write(msg) {
        if (msg.method === "session/load") tap.watchId = msg.id;
        const w = ws.writable.getWriter();
        try {
          await w.write(msg);
        } finally {
          w.releaseLock();
        }
      },
      close() {
        return ws.writable.close();
      },
    }),
  };
  const app = acp
    .client({ name: "tether-acp-bench" })
    .onNotification(acp.methods.client.session.update, ({ params }) => onUpdate(params, monotonicMS()))
    .onRequest("*", ({ method }) => {
      result.errors.push(`unexpected request ${method}`);
      throw acp.RequestError.methodNotFound(method);
    });
  const conn = app.connect(stream);
  const closed = new Promise((resolve) => {
    const wait = () => (socket ? socket.once("close", resolve) : setTimeout(wait, 1));
    wait();
  });
  return {
    agent: conn.agent,
    tap,
    close: async () => {
      socket.close(1000);
      await closed;
    },
  };
}

const timer = setTimeout(() => {
  result.errors.push(`timed out after ${flags.timeout} ms`);
  finish(3);
}, flags.timeout);
timer.unref();

let finished = false;
function finish(code) {
  if (finished) return;
  finished = true;
  process.stdout.write(JSON.stringify(result) + "\n", () => process.exit(code));
}

const textOf = (u) => (u?.content?.type === "text" ? u.content.text : undefined);

// checkRun checks that got holds "b1 " … "bN " in order, each with its
// agent/t, and records what is wrong.
function checkRun(what, got, n, problems = result.errors) {
  if (got.length !== n) problems.push(`${what}: ${got.length} updates, want ${n}`);
  for (let i = 0; i < Math.min(got.length, n); i++) {
    const u = got[i].update;
    if (u?.sessionUpdate !== "agent_message_chunk" || textOf(u) !== `b${i + 1} ` || typeof u._meta?.["agent/t"] !== "number") {
      problems.push(`${what}: update ${i} is ${JSON.stringify(u)}, want the chunk "b${i + 1} " with _meta["agent/t"]`);
      return;
    }
  }
}

const initParams = {
  protocolVersion: acp.PROTOCOL_VERSION,
  clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
  clientInfo: { name: "tether-acp-bench", version: "1.0.0" },
};

// sink collects the updates of the session being measured; the handler
// stamps each.
let sink = { sessionId: undefined, got: [] };
const onUpdate = (params, t) => {
  if (params.sessionId === sink.sessionId) sink.got.push({ t, update: params.update });
};

try {
  const c = connect(onUpdate);
  await c.agent.request(acp.methods.agent.initialize, initParams);
  const cwd = process.cwd();
  const prompt = (sessionId, text) =>
    c.agent.request(acp.methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text }] });
  const { sessionId: a } = await c.agent.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });

  if (flags.warmup > 0) {
    phase("warmup");
    sink = { sessionId: a, got: [] };
    const r = await prompt(a, `bench ${flags.warmup}`);
    if (r.stopReason !== "end_turn") result.errors.push(`warmup: stopReason ${r.stopReason}`);
    checkRun("warmup", sink.got, flags.warmup);
  }

  if (flags.paced > 0) {
    phase("paced");
    sink = { sessionId: a, got: [] };
    const r = await prompt(a, `bench ${flags.paced} delay ${flags.delay}`);
    if (r.stopReason !== "end_turn") result.errors.push(`paced: stopReason ${r.stopReason}`);
    checkRun("paced", sink.got, flags.paced);
    result.latency = {
      n: sink.got.length,
      ms: sink.got.map((g) => g.t - g.update._meta?.["agent/t"]),
      sent: sink.got.map((g) => g.update._meta?.["agent/t"]),
    };
  }

  // bursts are the throughput phase's prompt sizes.
  const bursts = [];
  for (let left = flags.updates; left > 0; left -= flags.burst) bursts.push(Math.min(left, flags.burst));
  let b;
  if (bursts.length > 0) {
    ({ sessionId: b } = await c.agent.request(acp.methods.agent.session.new, { cwd, mcpServers: [] }));
    phase("throughput");
    const t0 = monotonicMS();
    const per = [];
    for (const [i, k] of bursts.entries()) {
      sink = { sessionId: b, got: [] };
      const s0 = monotonicMS();
      const r = await prompt(b, `bench ${k}`);
      const s1 = monotonicMS();
      if (r.stopReason !== "end_turn") result.errors.push(`throughput prompt ${i}: stopReason ${r.stopReason}`);
      const got = sink.got;
      checkRun(`throughput prompt ${i}`, got, k);
      if (got.length === 0) break;
      const last = got[got.length - 1];
      per.push({
        n: got.length,
        promptMS: s1 - s0,
        firstUpdateMS: got[0].t - s0,
        agentStartMS: got[0].update._meta["agent/t"] - s0,
        firstToLastMS: last.t - got[0].t,
        agentFirstToLastMS: last.update._meta["agent/t"] - got[0].update._meta["agent/t"],
      });
    }
    const t1 = monotonicMS();
    phase("throughput-end");
    const n = per.reduce((x, p) => x + p.n, 0);
    const streamN = per.reduce((x, p) => x + p.n - 1, 0);
    const streamMS = per.reduce((x, p) => x + p.firstToLastMS, 0);
    result.throughput = {
      n,
      prompts: per.length,
      totalMS: t1 - t0,
      updatesPerSec: (n / (t1 - t0)) * 1000,
      streamingPerSec: streamMS > 0 ? (streamN / streamMS) * 1000 : null,
      bursts: per,
    };
  }
  await c.close();

  if (flags.load && b !== undefined) {
    sink = { sessionId: b, got: [] };
    const d = connect(onUpdate);
    await d.agent.request(acp.methods.agent.initialize, initParams);
    phase("load");
    const t0 = monotonicMS();
    await d.agent.request(acp.methods.agent.session.load, { sessionId: b, cwd, mcpServers: [] });
    const t1 = monotonicMS();
    phase("load-end");
    const problems = [];
    const user = sink.got.filter((g) => g.update?.sessionUpdate === "user_message_chunk");
    const wantUser = bursts.map((k) => `bench ${k}`);
    if (JSON.stringify(user.map((u) => textOf(u.update))) !== JSON.stringify(wantUser)) {
      problems.push(`load: ${user.length} user_message_chunk updates (${JSON.stringify(textOf(user[0]?.update))} first), want ${wantUser.length} (${JSON.stringify(wantUser[0])} first)`);
    }
    if (d.tap.before !== sink.got.length) {
      problems.push(`load: ${d.tap.before} updates before the response, ${sink.got.length} in all`);
    }
    // The replay in order: each prompt, then its chunks.
    let at = 0;
    for (const [i, k] of bursts.entries()) {
      if (sink.got[at]?.update?.sessionUpdate !== "user_message_chunk") {
        problems.push(`load: replayed update ${at} is not prompt ${i}'s user_message_chunk`);
        break;
      }
      checkRun(`load of prompt ${i}`, sink.got.slice(at + 1, at + 1 + k), k, problems);
      at += 1 + k;
    }
    const chunks = sink.got.filter((g) => g.update?.sessionUpdate !== "user_message_chunk");
    result.load = {
      responseMS: t1 - t0,
      firstUpdateMS: d.tap.firstUpdate === undefined ? null : d.tap.firstUpdate - t0,
      replayed: d.tap.before,
      userChunks: user.length,
      agentChunks: chunks.length,
      complete: problems.length === 0,
      problems,
    };
    await d.close();
  }

  if (flags.single > 0) {
    sink = { sessionId: undefined, got: [] };
    const e = connect(onUpdate);
    await e.agent.request(acp.methods.agent.initialize, initParams);
    const { sessionId: sc } = await e.agent.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });
    sink = { sessionId: sc, got: [] };
    phase("single");
    const t0 = monotonicMS();
    result.single = { n: flags.single, completed: false, received: 0 };
    try {
      const r = await e.agent.request(acp.methods.agent.session.prompt, { sessionId: sc, prompt: [{ type: "text", text: `bench ${flags.single}` }] });
      result.single.stopReason = r.stopReason;
      result.single.completed = r.stopReason === "end_turn" && sink.got.length === flags.single;
    } catch (err) {
      result.single.error = { code: err?.code ?? null, message: String(err?.message ?? err), data: err?.data ?? null };
    }
    result.single.promptMS = monotonicMS() - t0;
    result.single.received = sink.got.length;
    phase("single-end");
    await e.close();
  }
  phase("done");
  finish(result.errors.length === 0 ? 0 : 1);
} catch (err) {
  result.errors.push(`exception: ${err?.stack ?? err}`);
  finish(1);
}
