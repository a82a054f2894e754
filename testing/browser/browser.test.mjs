// Real-browser test of the terminal page (plugins/ws/web) against a real
// `tether serve` and a real /bin/sh, driven through Chromium with
// playwright-core. Run with `npm test` in this directory (see README.md).
//
// Environment:
//   CHROMIUM_PATH        the Chromium to drive (default /usr/bin/chromium)
//   TETHER_TEST_BINARY   use this binary instead of building ./cmd/tether
//   BROWSER_TEST_TIMEOUT timeout of each wait in ms (default 20000)

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const artifacts = path.join(here, "artifacts");
const wait = Number(process.env.BROWSER_TEST_TIMEOUT) || 20000;
const startTimeout = 30000; // for the listening line
const stopTimeout = 5000; // from SIGTERM to SIGKILL
const listening = /^tether listening on (http:\/\/\S+\/\?token=(\S+))$/;

let tmp; // scratch dir: the binary and the state dir
let stateDir;
let server; // the `tether serve` child
let serverLog = []; // its stderr lines, for failures
let url; // the listening URL with ?token=
let token; // the access token in it
let bin; // the tether binary
let browser;

before(
  async () => {
    tmp = mkdtempSync(path.join(tmpdir(), "tether-browser-"));
    stateDir = path.join(tmp, "state");
    mkdirSync(stateDir, { mode: 0o700 });

    bin = process.env.TETHER_TEST_BINARY;
    if (!bin) {
      bin = path.join(tmp, "tether");
      execFileSync("go", ["build", "-o", bin, "./cmd/tether"], { cwd: repo, stdio: "inherit" });
    }
    ({ url, token } = await startServer(["--listen", "127.0.0.1:0"]));

    browser = await chromium.launch({
      executablePath: process.env.CHROMIUM_PATH || "/usr/bin/chromium",
      args: [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
      ],
    });
  },
  { timeout: 300000 },
);

after(
  async () => {
    if (browser) await browser.close().catch(() => {});
    await stopServer();
    await stopPTYPlugin();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  },
  { timeout: 30000 },
);

// startServer runs `tether serve` with a clean environment (so the token
// comes from the state dir's token file) and extra args, and returns the
// URL and the token from its first stdout line.
function startServer(extra) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("TETHER_")));
  const args = ["serve", ...extra, "--state-dir", stateDir, "--log-format", "json", "--pty-command", "/bin/sh"];
  server = spawn(bin, args, { env, stdio: ["ignore", "pipe", "pipe"] });
  server.exited = new Promise((resolve) => server.once("exit", (code, signal) => resolve({ code, signal })));
  readline.createInterface({ input: server.stderr }).on("line", (l) => {
    serverLog.push(l);
    if (serverLog.length > 400) serverLog = serverLog.slice(-200);
  });
  const stdout = readline.createInterface({ input: server.stdout });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(`no listening line within ${startTimeout} ms`), startTimeout);
    function fail(why) {
      clearTimeout(timer);
      reject(new Error(`tether serve: ${why}\n--- stderr ---\n${serverLog.slice(-50).join("\n")}`));
    }
    stdout.once("line", (line) => {
      clearTimeout(timer);
      const m = listening.exec(line);
      if (m) resolve({ url: m[1], token: m[2] });
      else fail(`first stdout line is ${JSON.stringify(line)}`);
    });
    stdout.on("line", () => {}); // keep draining
    server.once("error", (err) => fail(err.message));
    server.exited.then(({ code, signal }) => fail(`exited (code ${code}, signal ${signal})`));
  });
}

// stopServer sends SIGTERM, then SIGKILL after stopTimeout.
async function stopServer() {
  if (!server || server.exitCode !== null || server.signalCode !== null) return;
  server.kill("SIGTERM");
  const timer = setTimeout(() => server.kill("SIGKILL"), stopTimeout);
  await server.exited;
  clearTimeout(timer);
}

// stopPTYPlugin stops the PTY plugin the host leaves running for the next host,
// found by its reattach record.
async function stopPTYPlugin() {
  if (!stateDir) return;
  const record = path.join(stateDir, "plugins", "pty.json");
  if (!existsSync(record)) return;
  let pid;
  try {
    pid = JSON.parse(readFileSync(record, "utf8")).pid;
  } catch {
    return;
  }
  if (!Number.isInteger(pid) || pid <= 1 || pid === process.pid) return;
  // A pid may have been reused: only stop a tether process.
  try {
    if (!readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("tether")) return;
  } catch {
    return; // gone already
  }
  const alive = () => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };
  try {
    process.kill(pid, "SIGTERM");
  } catch {
    return;
  }
  for (const deadline = Date.now() + stopTimeout; Date.now() < deadline && alive(); ) {
    await new Promise((r) => setTimeout(r, 50));
  }
  if (alive()) process.kill(pid, "SIGKILL");
}

// withContext runs fn with a fresh browser context (its own localStorage).
// On failure it saves a screenshot and the console of every page to
// artifacts/ and prints the tail of the server's stderr.
async function withContext(t, fn) {
  const ctx = await browser.newContext({ viewport: { width: 1000, height: 600 } });
  const consoles = [];
  ctx.on("page", (page) => {
    const n = consoles.push([]) - 1;
    page.on("console", (m) => consoles[n].push(`${m.type()}: ${m.text()}`));
    page.on("pageerror", (e) => consoles[n].push(`pageerror: ${e.message}`));
  });
  try {
    await fn(ctx);
  } catch (err) {
    mkdirSync(artifacts, { recursive: true });
    const base = t.name.replace(/[^A-Za-z0-9_-]+/g, "_");
    for (const [i, page] of ctx.pages().entries()) {
      const file = path.join(artifacts, `${base}-tab${i}.png`);
      await page.screenshot({ path: file }).catch(() => {});
      writeFileSync(path.join(artifacts, `${base}-tab${i}.console.txt`), (consoles[i] || []).join("\n") + "\n");
      t.diagnostic(`saved ${path.relative(repo, file)}`);
    }
    writeFileSync(path.join(artifacts, `${base}-server.log`), serverLog.join("\n") + "\n");
    t.diagnostic("tether serve stderr, last lines:");
    for (const line of serverLog.slice(-20)) t.diagnostic(line);
    throw err;
  } finally {
    await ctx.close().catch(() => {});
  }
}

async function open(ctx) {
  const page = await ctx.newPage();
  const resp = await page.goto(url);
  assert.equal(resp.status(), 200, `GET ${url}: the terminal page is not served`);
  return page;
}

// waitState waits for document.body.dataset.state; on a timeout the error
// says where the page is instead.
async function waitState(page, state) {
  try {
    await page.waitForFunction((s) => document.body.dataset.state === s, state, { timeout: wait });
  } catch (err) {
    const now = await page
      .evaluate(() => {
        const d = document.body.dataset;
        const text = document.getElementById("status-text");
        return `state ${d.state}, closeCode ${d.closeCode}, status "${text && text.textContent}"`;
      })
      .catch((e) => e.message);
    throw new Error(`waiting for state ${state}: ${err.message.split("\n")[0]}; page has ${now}`);
  }
}

// waitText waits until the terminal's buffer matches the regular
// expression source re and returns the first group (or the whole match).
async function waitText(page, re) {
  const h = await page.waitForFunction(
    (src) => {
      const b = window.tether.term.buffer.active;
      const lines = [];
      for (let i = 0; i < b.length; i++) lines.push(b.getLine(i).translateToString(true));
      const m = new RegExp(src).exec(lines.join("\n"));
      return m ? (m[1] ?? m[0]) : false;
    },
    re,
    { timeout: wait },
  );
  return h.jsonValue();
}

async function type(page, line) {
  await page.evaluate(() => window.tether.term.focus());
  await page.keyboard.type(line);
  await page.keyboard.press("Enter");
}

test("reload replays the same shell", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await open(ctx);
    await waitState(page, "connected");
    assert.ok(!page.url().includes("token="), `token left in the URL: ${page.url()}`);
    await type(page, "echo pid=$$");
    const pid = await waitText(page, String.raw`pid=(\d+)`);

    await page.reload();
    await waitState(page, "connected");
    await waitText(page, `pid=${pid}\\b`); // replayed into the fresh page

    await type(page, "echo again=$$");
    const again = await waitText(page, String.raw`again=(\d+)`);
    assert.equal(again, pid, "the reloaded page talks to another shell");
  }),
);

test("a second tab supersedes the first", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const a = await open(ctx);
    await waitState(a, "connected");
    const b = await open(ctx); // same context: same localStorage, same attach token
    await waitState(b, "connected");
    await waitState(a, "superseded");
    assert.equal(await a.evaluate(() => document.body.dataset.closeCode), "4409");
    assert.match(await a.textContent("#status-text"), /another tab/);
    assert.ok(await a.isVisible("#reconnect"), "no Reconnect button in the superseded tab");
    assert.equal(await b.evaluate(() => window.tether.attach()), await a.evaluate(() => window.tether.attach()));

    // Reconnect in tab A takes the terminal back.
    await a.click("#reconnect");
    await waitState(a, "connected");
    await waitState(b, "superseded");
  }),
);

// bare is the listening URL without its query: what a bookmark holds.
function bare() {
  return new URL("/", url).href;
}

test("signed in through the cookie", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const sockets = [];
    ctx.on("page", (p) => p.on("websocket", (ws) => sockets.push(ws.url())));
    const page = await open(ctx);
    await waitState(page, "connected");

    const cookies = (await ctx.cookies()).filter((c) => c.name === "tether_token");
    assert.equal(cookies.length, 1, `cookies: ${JSON.stringify(await ctx.cookies())}`);
    const c = cookies[0];
    assert.equal(c.value, token);
    assert.equal(c.path, "/");
    assert.equal(c.httpOnly, true, "the cookie is not HttpOnly");
    assert.equal(c.sameSite, "Strict");
    assert.equal(c.secure, false, "Secure on a plain-HTTP page");
    // Persistent, like the token file: a bookmark works in a later
    // browser session too (400 days, the longest browsers keep one).
    const days = (c.expires - Date.now() / 1000) / 86400;
    assert.ok(days > 399 && days <= 400, `the cookie expires in ${days} days, want 400`);
    assert.equal(await page.evaluate(() => document.cookie), "", "a script can read the cookie");
    assert.equal(await page.evaluate(() => sessionStorage.getItem("tether.access")), null, "the page keeps the token in sessionStorage");

    // The bare URL (a bookmark), a reload of it, and a second tab of it.
    const resp = await page.goto(bare());
    assert.equal(resp.status(), 200, "the bare URL is not served with the cookie");
    await waitState(page, "connected");
    await page.reload();
    await waitState(page, "connected");
    const second = await ctx.newPage();
    assert.equal((await second.goto(bare())).status(), 200);
    await waitState(second, "connected");

    assert.ok(sockets.length >= 4, `WebSockets opened: ${sockets.join(", ")}`);
    for (const s of sockets) {
      assert.ok(s.includes("/api/pty?"), `WebSocket to ${s}`);
      assert.ok(!/[?&]token=/.test(s), `the token in a WebSocket URL: ${s}`);
    }
  }),
);

test("a wrong or missing token gets the 401 page and no cookie", { timeout: 60000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await ctx.newPage();
    for (const [target, says] of [
      [new URL("/?token=wrong", url).href, "not this server's token"],
      [bare(), "had none"],
    ]) {
      const resp = await page.goto(target);
      assert.equal(resp.status(), 401, `GET ${target}`);
      const text = await page.textContent("body");
      assert.match(text, new RegExp(says), `GET ${target}`);
      assert.match(text, /tether serve/);
      assert.match(text, /<state-dir>\/token/);
    }
    assert.deepEqual(await ctx.cookies(), [], "a refused page set a cookie");
  }),
);

// Last: it replaces the server.
test("the open page stays signed in across a host restart", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await open(ctx);
    await waitState(page, "connected");
    await type(page, "echo pid=$$");
    const pid = await waitText(page, String.raw`pid=(\d+)`);

    const addr = new URL(url).host;
    await stopServer();
    await waitState(page, "reconnecting");
    const again = await startServer(["--listen", addr]);
    assert.equal(again.token, token, "the restarted host has another token (token file)");
    url = again.url;

    await waitState(page, "connected"); // the page's own retry, with its cookie
    await type(page, "echo after=$$");
    assert.equal(await waitText(page, String.raw`after=(\d+)`), pid, "another shell after the restart");
    const resp = await page.goto(bare());
    assert.equal(resp.status(), 200, "the bare URL after the restart");
    await waitState(page, "connected");
    const tab = await ctx.newPage();
    assert.equal((await tab.goto(bare())).status(), 200, "a new tab after the restart");
    await waitState(tab, "connected");
  }),
);
