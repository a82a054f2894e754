// Drives an ACP agent command over stdio with the official SDK client, as
// an editor does: used for `tether acp`, the bridge from stdio to a host's
// /acp. It runs initialize, session/new, one prompt, then a second
// process: initialize and session/load of that session; each process's
// stdin is then closed and its exit awaited. It prints one JSON object
// with what happened; the Go test TestACPStdioBridge (testing/e2e)
// asserts on it.
//
// Usage: node stdio.mjs TEXT COMMAND [ARGS...]
import * as acp from "@agentclientprotocol/sdk";
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";

const [text, command, ...args] = process.argv.slice(2);
if (!text || !command) {
  process.stderr.write("usage: node stdio.mjs TEXT COMMAND [ARGS...]\n");
  process.exit(2);
}

// start spawns the command and connects an SDK client to its stdio.
function start() {
  const child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  const state = { updates: [] };
  const conn = acp
    .client({ name: "stdio" })
    .onNotification(acp.methods.client.session.update, ({ params }) => {
      state.updates.push({ update: params.update, seq: params._meta?.["tether/seq"] ?? null });
    })
    .onRequest(acp.methods.client.session.requestPermission, () => ({ outcome: { outcome: "cancelled" } }))
    .connect(acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout)));
  return { child, exited, state, agent: conn.agent };
}

const init = { protocolVersion: 1, clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false } };
const out = {};
const timer = setTimeout(() => {
  process.stderr.write("stdio.mjs: timed out\n");
  process.exit(1);
}, 60000);

const a = start();
out.initialize = await a.agent.request(acp.methods.agent.initialize, init);
const made = await a.agent.request(acp.methods.agent.session.new, { cwd: process.cwd(), mcpServers: [] });
out.sessionId = made.sessionId;
const res = await a.agent.request(acp.methods.agent.session.prompt, { sessionId: made.sessionId, prompt: [{ type: "text", text }] });
out.prompt = { stopReason: res.stopReason, updates: a.state.updates };
a.child.stdin.end();
out.exit = await a.exited;

const b = start();
await b.agent.request(acp.methods.agent.initialize, init);
await b.agent.request(acp.methods.agent.session.load, { sessionId: made.sessionId, cwd: process.cwd(), mcpServers: [] });
out.load = { updates: b.state.updates };
b.child.stdin.end();
out.loadExit = await b.exited;

clearTimeout(timer);
process.stdout.write(JSON.stringify(out) + "\n");
