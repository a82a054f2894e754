// A minimal WebSocket-to-stdio relay for ACP: each WebSocket connection on
// /acp gets its own agent process, each text frame goes to the agent's stdin
// as one line and each line of its stdout comes back as one text frame. It
// keeps nothing, replays nothing and adds no _meta: it is what an ACP
// client has without tether, the baseline for the kit's own checks (the
// client scenarios work before the host does) and for the benchmark of
// tether's overhead.
//
// Usage: node relay.mjs -- AGENT_COMMAND [ARGS…]
//   It prints `relay listening on ws://127.0.0.1:PORT/acp` once it listens
//   (on a free port), then one line `RELAY {"conn":N,"auth":"header"|"query"}`
//   per accepted connection. With ACP_TEST_TOKEN set, a connection without
//   that token (Authorization: Bearer, or ?token=) is accepted and closed at
//   once with 4401, as tether does.
import { spawn } from "node:child_process";
import http from "node:http";
import { WebSocketServer } from "ws";

const sep = process.argv.indexOf("--");
const command = sep >= 0 ? process.argv.slice(sep + 1) : [];
if (command.length === 0) {
  process.stderr.write("usage: node relay.mjs -- AGENT_COMMAND [ARGS…]\n");
  process.exit(2);
}
const token = process.env.ACP_TEST_TOKEN ?? "";

const server = http.createServer((_req, res) => {
  res.writeHead(404).end();
});
const wss = new WebSocketServer({ server, path: "/acp" });
let conns = 0;

wss.on("connection", (ws, req) => {
  const n = ++conns;
  const url = new URL(req.url, "http://relay");
  let auth = "none";
  if (req.headers.authorization === `Bearer ${token}`) auth = "header";
  else if (url.searchParams.get("token") === token) auth = "query";
  process.stdout.write(`RELAY ${JSON.stringify({ conn: n, auth })}\n`);
  if (token && auth === "none") {
    ws.close(4401, "unauthorized");
    return;
  }
  const agent = spawn(command[0], command.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  let buf = "";
  agent.stdout.setEncoding("utf8");
  agent.stdout.on("data", (data) => {
    buf += data;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      if (line.trim()) ws.send(line);
    }
  });
  agent.on("exit", () => ws.close(1011, "agent exited"));
  agent.stdin.on("error", () => {});
  ws.on("message", (data, isBinary) => {
    if (!isBinary) agent.stdin.write(data.toString("utf8") + "\n");
  });
  ws.on("close", () => agent.stdin.end());
});

server.listen(0, "127.0.0.1", () => {
  process.stdout.write(`relay listening on ws://127.0.0.1:${server.address().port}/acp\n`);
});
process.on("SIGTERM", () => process.exit(0));
