// Drives agent.mjs directly over stdio with the official SDK client (no
// tether in between) through every command of its prompt mini-language, a
// restart with session/load, and a --no-load start. It prints one JSON
// object with what happened at each step; the Go test TestACPTestAgentDirect
// (testing/e2e) asserts on it and on the agent's log.
//
// Usage: node direct.mjs DIR   (DIR: the agent's --dir; its log is DIR/agent.log)
import * as acp from "@agentclientprotocol/sdk";
import { spawn } from "node:child_process";
import path from "node:path";
import { Readable, Writable } from "node:stream";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const dir = process.argv[2];
if (!dir) {
  process.stderr.write("usage: node direct.mjs DIR\n");
  process.exit(2);
}
const logFile = path.join(dir, "agent.log");

// start spawns the agent and connects an SDK client to its stdio. onUpdate
// gets every session/update; permission answers session/request_permission.
function start(extraArgs = []) {
  const child = spawn(process.execPath, [path.join(here, "agent.mjs"), "--dir", dir, "--log", logFile, ...extraArgs], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  const state = { updates: [], permission: () => ({ outcome: { outcome: "cancelled" } }), permissions: [] };
  const conn = acp
    .client({ name: "direct" })
    .onNotification(acp.methods.client.session.update, ({ params }) => {
      state.updates.push(params.update);
      state.onUpdate?.(params);
    })
    .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
      state.permissions.push(params);
      return state.permission(params);
    })
    .connect(acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout)));
  return { child, exited, state, agent: conn.agent, conn };
}

function errorOf(err) {
  return { code: err?.code ?? null, message: String(err?.message ?? err), data: err?.data ?? null };
}

// prompt sends one prompt and returns the updates it produced and how it ended.
async function prompt(a, sessionId, text, during) {
  a.state.updates = [];
  const p = a.agent.request(acp.methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text }] });
  during?.();
  try {
    const res = await p;
    return { updates: a.state.updates, stopReason: res.stopReason };
  } catch (err) {
    return { updates: a.state.updates, error: errorOf(err) };
  }
}

async function call(fn) {
  try {
    return { result: await fn() };
  } catch (err) {
    return { error: errorOf(err) };
  }
}

const out = {};
const init = { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false } };

// First process: every command.
const a = start();
out.initialize = await a.agent.request(acp.methods.agent.initialize, init);
const { sessionId } = await a.agent.request(acp.methods.agent.session.new, { cwd: dir, mcpServers: [] });
out.sessionId = sessionId;
out.chunks = await prompt(a, sessionId, "chunks 3 delay 10");
out.tool = await prompt(a, sessionId, "tool");
a.state.permission = () => ({ outcome: { outcome: "selected", optionId: "allow" } });
out.permissionAllow = await prompt(a, sessionId, "permission");
a.state.permission = () => ({ outcome: { outcome: "cancelled" } });
out.permissionCancelled = await prompt(a, sessionId, "permission");
out.permissionRequests = a.state.permissions;
out.slow = await prompt(a, sessionId, "slow 10", () => {
  a.state.onUpdate = () => {
    if (a.state.updates.length === 3) {
      a.state.onUpdate = undefined;
      void a.agent.notify(acp.methods.agent.session.cancel, { sessionId });
    }
  };
});
out.echo = await prompt(a, sessionId, "  hello   world ");
out.fail = await prompt(a, sessionId, "fail");
out.unknownSession = await prompt(a, "sess-unknown", "hello");
out.crash = await prompt(a, sessionId, "crash");
out.crashExit = await a.exited;

// Second process on the same dir: prompting needs a load first.
const b = start();
out.restart = {};
out.restart.initialize = await b.agent.request(acp.methods.agent.initialize, init);
out.restart.promptBeforeLoad = await prompt(b, sessionId, "hello");
b.state.updates = [];
out.restart.load = await call(() => b.agent.request(acp.methods.agent.session.load, { sessionId, cwd: dir, mcpServers: [] }));
out.restart.replayed = b.state.updates;
out.restart.loadUnknown = await call(() => b.agent.request(acp.methods.agent.session.load, { sessionId: "sess-unknown", cwd: dir, mcpServers: [] }));
out.restart.after = await prompt(b, sessionId, "chunks 2");
out.restart.list = await call(() => b.agent.request(acp.methods.agent.session.list, {}));
b.child.stdin.end();
out.restart.exit = await b.exited;

// Third process without load support.
const c = start(["--no-load"]);
out.noLoad = {};
out.noLoad.initialize = await c.agent.request(acp.methods.agent.initialize, init);
out.noLoad.load = await call(() => c.agent.request(acp.methods.agent.session.load, { sessionId, cwd: dir, mcpServers: [] }));
c.child.stdin.end();
out.noLoad.exit = await c.exited;

process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
