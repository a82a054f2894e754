// Real-browser test of the page (plugins/ws/web), its terminal and its
// chat view, against a real `tether serve` with a real /bin/sh and the
// echo agent (and, for the ACP chats, hosts of their own with the ACP test
// kit's agent, and the kit's client as another client), driven through
// Chromium with playwright-core. Run with `npm test` in
// this directory (see README.md).
//
// Environment:
//   CHROMIUM_PATH        the Chromium to drive (default /usr/bin/chromium)
//   TETHER_TEST_BINARY   use this binary instead of building ./cmd/tether
//   BROWSER_TEST_TIMEOUT timeout of each wait in ms (default 20000)

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile, execFileSync, spawn } from "node:child_process";
import http from "node:http";
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

// startServer starts the shared `tether serve` (the server every test but
// the ACP one talks to: PTYs run /bin/sh, the echo agent streams a word
// every 50 ms) with extra args, and returns the URL and the token from
// its first stdout line.
async function startServer(extra) {
  const h = spawnTether(stateDir, [...extra, "--pty-command", "/bin/sh", "--echo-delay", "50ms"], (l) => {
    serverLog.push(l);
    if (serverLog.length > 400) serverLog = serverLog.slice(-200);
  });
  server = h.proc;
  return h.started;
}

// spawnTether runs `tether serve` on state dir dir with a clean
// environment (so the token comes from the state dir's token file) and
// extra args; each stderr line goes to onLog. started resolves to the
// URL and the token of its first stdout line.
function spawnTether(dir, extra, onLog) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("TETHER_")));
  const args = ["serve", ...extra, "--state-dir", dir, "--log-format", "json"];
  const proc = spawn(bin, args, { env, stdio: ["ignore", "pipe", "pipe"] });
  proc.exited = new Promise((resolve) => proc.once("exit", (code, signal) => resolve({ code, signal })));
  const lines = [];
  readline.createInterface({ input: proc.stderr }).on("line", (l) => {
    lines.push(l);
    if (lines.length > 100) lines.shift();
    onLog(l);
  });
  const stdout = readline.createInterface({ input: proc.stdout });
  const started = new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(`no listening line within ${startTimeout} ms`), startTimeout);
    function fail(why) {
      clearTimeout(timer);
      reject(new Error(`tether serve: ${why}\n--- stderr ---\n${lines.slice(-50).join("\n")}`));
    }
    stdout.once("line", (line) => {
      clearTimeout(timer);
      const m = listening.exec(line);
      if (m) resolve({ url: m[1], token: m[2] });
      else fail(`first stdout line is ${JSON.stringify(line)}`);
    });
    stdout.on("line", () => {}); // keep draining
    proc.once("error", (err) => fail(err.message));
    proc.exited.then(({ code, signal }) => fail(`exited (code ${code}, signal ${signal})`));
  });
  return { proc, started };
}

// stopServer stops the shared server.
function stopServer() {
  return stopTether(server);
}

// stopTether sends SIGTERM, then SIGKILL after stopTimeout.
async function stopTether(proc) {
  if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
  proc.kill("SIGTERM");
  const timer = setTimeout(() => proc.kill("SIGKILL"), stopTimeout);
  await proc.exited;
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
// artifacts/ and prints the tail of the server's stderr; label tells the
// files of a test's second context apart.
async function withContext(t, fn, label = "") {
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
    const base = t.name.replace(/[^A-Za-z0-9_-]+/g, "_") + label;
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

// screen returns what a test compares of the active buffer: its kind,
// every line, the visible rows and the cursor. Trailing spaces are
// trimmed (a space the shell wrote and a cell never written look the
// same, and a snapshot need not tell them apart) and trailing empty lines
// dropped.
function screen(page) {
  return page.evaluate(() => {
    const t = window.tether.term;
    const b = t.buffer.active;
    const lines = [];
    for (let i = 0; i < b.length; i++) lines.push(b.getLine(i).translateToString(true).trimEnd());
    while (lines.length && lines[lines.length - 1] === "") lines.pop();
    const rows = [];
    for (let i = b.baseY; i < b.baseY + t.rows; i++) rows.push(b.getLine(i).translateToString(true).trimEnd());
    return { type: b.type, lines, rows, cursor: [b.cursorX, b.cursorY], size: [t.cols, t.rows] };
  });
}

// lastReplay is the page's last pty.replay header.
function lastReplay(page) {
  return page.evaluate(() => window.tether.replay());
}

// dimmed reports whether the page shows the terminal dimmed with its
// overlay, and whether xterm.js takes no input.
function dimmed(page) {
  return page.evaluate(() => {
    const term = document.getElementById("terminal");
    const overlay = document.getElementById("overlay");
    return (
      Number(getComputedStyle(term).opacity) < 0.6 &&
      getComputedStyle(overlay).visibility === "visible" &&
      Number(getComputedStyle(overlay).opacity) === 1 &&
      window.tether.term.options.disableStdin === true
    );
  });
}

async function waitDimmed(page) {
  await page.waitForFunction(
    () => {
      const term = document.getElementById("terminal");
      const overlay = document.getElementById("overlay");
      return Number(getComputedStyle(term).opacity) < 0.6 && Number(getComputedStyle(overlay).opacity) === 1;
    },
    null,
    { timeout: wait },
  );
  assert.ok(await dimmed(page), "not dimmed, or xterm.js still takes input");
}

// waitPrompt waits until the cursor's line is exactly /bin/sh's prompt
// ("$ ", or "# " for root), which the shell prints last.
async function waitPrompt(page) {
  await page.waitForFunction(
    () => {
      const b = window.tether.term.buffer.active;
      return /^[$#]$/.test(b.getLine(b.baseY + b.cursorY).translateToString(true).trimEnd());
    },
    null,
    { timeout: wait },
  );
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
    await waitText(page, `pid=${pid}\\b`); // in the snapshot of the fresh page

    await type(page, "echo again=$$");
    const again = await waitText(page, String.raw`again=(\d+)`);
    assert.equal(again, pid, "the reloaded page talks to another shell");
  }),
);

// The program asks the terminal DA, CPR, OSC 10/11 and DECRQM when it
// starts; the live page answers (or it would never print READY1). Two
// reloads restore its screen from snapshots, and a tab that was
// superseded takes the terminal back with its cursor, so it gets the raw
// bytes it missed — the second batch of queries — as a replay. Whatever
// xterm.js answers to replayed queries must not reach the program: a
// typed line comes back as exactly GOT:<line>.
test("no answer to a replayed query reaches the program", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const prog = path.join(here, "testdata", "queries.mjs");
    const page = await open(ctx);
    await waitState(page, "connected");
    await waitPrompt(page); // typed before it, the prompt would land inside the line
    await type(page, `exec '${process.execPath}' '${prog}'`);
    await waitText(page, "READY1");

    for (let i = 0; i < 2; i++) {
      await page.reload();
      await waitState(page, "connected");
      const r = await lastReplay(page);
      assert.equal(r.snapshot, true, `reload ${i + 1}: ${JSON.stringify(r)}`);
      assert.equal(r.reason, "initial", `reload ${i + 1}: attached with a cursor: ${JSON.stringify(r)}`);
      await waitText(page, "READY1");
    }
    await type(page, "hello");
    assert.equal(await waitText(page, String.raw`(?:^|\n)GOT:([^\n]*)`), "hello");

    // A second tab takes the terminal and makes the program ask again;
    // the second tab answers live.
    const other = await open(ctx);
    await waitState(other, "connected");
    await waitState(page, "superseded");
    await type(other, "again");
    await waitText(other, "READY2");

    // The first tab takes it back and resumes from its cursor: the
    // queries come as replayed bytes.
    const before = await page.evaluate(() => window.tether.offset());
    await page.click("#reconnect");
    await waitState(page, "connected");
    const r = await lastReplay(page);
    assert.equal(r.reason, "resume", `the first tab did not resume: ${JSON.stringify(r)}`);
    assert.ok(r.replay_end_offset > before, `nothing replayed: ${JSON.stringify(r)}, offset was ${before}`);
    await waitText(page, "READY2");
    await type(page, "world");
    const got = await waitText(page, String.raw`(?:^|\n)GOT:((?!hello)[^\n]*)`);
    assert.equal(got, "world", "an answer to a replayed query reached the program");
    await type(page, "quit");
  }),
);

test("the screen after a reload is the screen before it", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await open(ctx);
    await waitState(page, "connected");
    // Colours, a line longer than the terminal, tabs and some lines.
    await type(page, String.raw`printf '\033[1;31mred\033[0m \033[42mgreen\033[0m\tTAB\n'; i=0; while [ $i -lt 40 ]; do printf 'line %s ' $i; i=$((i+1)); done; echo; seq 1 30`);
    await waitText(page, "\n30\n");
    await waitPrompt(page);
    const before = await screen(page);
    await page.reload();
    await waitState(page, "connected");
    assert.deepEqual(await screen(page), before, "the normal screen differs after a reload");

    // An alternate-screen program, as vim draws it.
    await type(page, String.raw`printf '\033[?1049h\033[2J\033[Hfull screen\n\033[7mreverse\033[0m\033[10;20Hat 10,20'; read x; printf '\033[?1049l'`);
    await page.waitForFunction(() => window.tether.term.buffer.active.type === "alternate", null, { timeout: wait });
    await waitText(page, "at 10,20");
    const alt = await screen(page);
    assert.equal(alt.type, "alternate");
    await page.reload();
    await waitState(page, "connected");
    assert.deepEqual(await screen(page), alt, "the alternate screen differs after a reload");

    // Leaving it shows the shell's screen again.
    await page.keyboard.press("Enter");
    await page.waitForFunction(() => window.tether.term.buffer.active.type === "normal", null, { timeout: wait });
    await waitText(page, String.raw`\n30\n`);
  }),
);

// A tab in a window of another size opens the terminal another tab left:
// the PTY takes the new tab's size before its snapshot is drawn, so the
// snapshot is of the screen at that size, and the shell says that size.
test("a tab of another size gets the snapshot for its size", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const first = await open(ctx);
    await waitState(first, "connected");
    await waitPrompt(first); // typed before it, the prompt would land inside the line
    await type(first, "echo MARK-BEFORE");
    await waitText(first, "\nMARK-BEFORE\n");
    const before = await first.evaluate(() => [window.tether.term.cols, window.tether.term.rows]);
    await first.close();

    const page = await ctx.newPage();
    await page.setViewportSize({ width: 700, height: 400 });
    const resp = await page.goto(url);
    assert.equal(resp.status(), 200);
    await waitState(page, "connected");
    const now = await page.evaluate(() => [window.tether.term.cols, window.tether.term.rows]);
    assert.notDeepEqual(now, before, "the smaller window fits the same size");
    const r = await lastReplay(page);
    assert.equal(r.snapshot, true, JSON.stringify(r));
    assert.deepEqual([r.cols, r.rows], now, `snapshot ${JSON.stringify(r)} is not drawn for the window's ${now}`);
    await waitText(page, "\nMARK-BEFORE\n");
    await type(page, "stty size");
    await waitText(page, `\n${now[1]} ${now[0]}\n`);
  }),
);

test("a second tab supersedes the first: dimmed, input blocked", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const a = await open(ctx);
    await waitState(a, "connected");
    assert.equal(await dimmed(a), false, "the connected tab is dimmed");
    const b = await open(ctx); // same context: same localStorage, same attach token
    await waitState(b, "connected");
    await waitState(a, "superseded");
    assert.equal(await a.evaluate(() => document.body.dataset.closeCode), "4409");
    assert.match(await a.textContent("#status-text"), /^taken over by another client: a tab, a window or tether attach \(4409\)/);
    assert.equal(await b.evaluate(() => window.tether.attach()), await a.evaluate(() => window.tether.attach()));
    await waitDimmed(a);
    assert.match(await a.textContent("#overlay"), /Taken over by another client/);
    assert.ok(await a.isVisible("#reconnect"), "no Take it back button in the superseded tab");

    // Typing in the superseded tab is refused, and it says so.
    await a.evaluate(() => window.tether.term.focus());
    await a.keyboard.type("x");
    await a.waitForFunction(() => /not sent/.test(document.getElementById("toast").textContent), null, { timeout: wait });

    // Take it back in tab A.
    await a.click("#reconnect");
    await waitState(a, "connected");
    await waitState(b, "superseded");
    assert.equal(await dimmed(a), false, "dimmed after taking the terminal back");
    await type(a, "echo back=$$");
    await waitText(a, String.raw`back=\d+`);
  }),
);

// pointAt returns the page coordinates of the middle of the cell in
// column col of the visible row whose text is exactly line.
async function pointAt(page, line, col) {
  const cell = await page.evaluate((line) => {
    const t = window.tether.term;
    const b = t.buffer.active;
    for (let y = 0; y < t.rows; y++) {
      if (b.getLine(b.viewportY + y).translateToString(true) === line) return { y, cols: t.cols, rows: t.rows };
    }
    return null;
  }, line);
  assert.ok(cell, `no row ${JSON.stringify(line)} on screen`);
  const box = await page.locator("#terminal .xterm-screen").boundingBox();
  return {
    x: box.x + ((col + 0.5) * box.width) / cell.cols,
    y: box.y + ((cell.y + 0.5) * box.height) / cell.rows,
  };
}

// A phone handed `tether share pty TOKEN --view`: the link opens that
// terminal, shows its output and says it is read-only; what is typed
// there never reaches the PTY (the writer's screen never shows it); a
// revoked link's page says so.
test("a view share link watches one terminal read-only", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const writer = await open(ctx);
    await waitState(writer, "connected");
    await waitPrompt(writer); // typed before it, the prompt would land inside the line
    await type(writer, "echo before_$((1+1))");
    await waitText(writer, String.raw`\nbefore_2`);
    const tok = await writer.evaluate(() => window.tether.attach());
    const share = execFileSync(bin, ["share", "pty", tok, "--view", "--name", "phone", "--state-dir", stateDir], {
      env: { ...process.env, TETHER_TOKEN: token },
    })
      .toString()
      .trim();
    assert.match(share, /[?&]view=1/);
    await withContext(t, async (phoneCtx) => {
      const phone = await phoneCtx.newPage();
      await phone.goto(share);
      await waitState(phone, "connected");
      await waitText(phone, String.raw`\nbefore_2`);
      assert.equal(await phone.evaluate(() => document.body.dataset.readonly), "1");
      assert.match(await phone.textContent("#status-text"), /read-only/);
      assert.doesNotMatch(phone.url(), /token=/, "the link's credential is left in the address bar");
      await phone.click("#terminal");
      await phone.keyboard.type("echo VIEWER_TYPED");
      await phone.keyboard.press("Enter");
      // The writer's next line is seen by the phone: everything before it
      // reached the PTY first, and the phone's keys are not among it.
      await type(writer, "echo after_$((2+2))");
      await waitText(phone, String.raw`\nafter_4`);
      await waitText(writer, String.raw`\nafter_4`);
      const writerScreen = await writer.evaluate(() => {
        const b = window.tether.term.buffer.active;
        const out = [];
        for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true));
        return out.join("\n");
      });
      assert.ok(!writerScreen.includes("VIEWER_TYPED"), "the view link's keys reached the PTY");
      execFileSync(bin, ["token", "revoke", "phone", "--state-dir", stateDir], { env: { ...process.env, TETHER_TOKEN: token } });
      await waitState(phone, "error");
      assert.match(await phone.textContent("#status-text"), /revoked/);
    }, "-phone");
  }),
);

// A colleague handed `tether share session KEY --view`: the link opens
// that chat in the chat view with its history, follows it live, and is
// read-only (no prompt box, no Stop, no New chat, said on screen); the
// link's credential and key leave the address bar; a revoked link's
// page says so.
test("a view share link of a chat follows it read-only", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const owner = await openChatView(ctx);
    await owner.click("#chat-new");
    await prompt(owner, "shared words");
    await waitRun(owner, "complete");
    const key = await owner.evaluate(() => window.tether.chat.session().key);
    const share = execFileSync(bin, ["share", "session", key, "--view", "--name", "colleague", "--state-dir", stateDir], {
      env: { ...process.env, TETHER_TOKEN: token },
    })
      .toString()
      .trim();
    assert.match(share, /[?&]session=/);
    assert.match(share, /[?&]view=1/);
    await withContext(t, async (otherCtx) => {
      const other = await otherCtx.newPage();
      await other.goto(share);
      await waitChat(other, "connected");
      assert.equal(await other.evaluate(() => document.body.dataset.view), "chat", "the link did not open the chat view");
      await other.waitForFunction((key) => window.tether.chat.session() && window.tether.chat.session().key === key, key, { timeout: wait });
      await other.waitForFunction(() => document.querySelectorAll("#chat-log > .msg").length === 2, null, { timeout: wait });
      assert.deepEqual(await messages(other), [
        ["user", "shared words"],
        ["assistant", "shared words"],
      ]);
      assert.equal(await other.evaluate(() => document.body.dataset.chatReadonly), "1");
      assert.match(await other.textContent("#chat-status"), /read-only/);
      assert.match(await other.getAttribute("#chat-input", "placeholder"), /Read-only/);
      for (const id of ["#chat-input", "#chat-send", "#chat-stop", "#chat-new"]) {
        assert.ok(await other.isDisabled(id), `${id} is enabled on a read-only link`);
      }
      assert.doesNotMatch(other.url(), /token=|session=/, "the link's credential or key is left in the address bar");
      // The owner's next prompt is followed live.
      await prompt(owner, "more words");
      await other.waitForFunction(() => document.querySelectorAll("#chat-log > .msg").length === 4, null, { timeout: wait });
      assert.ok(await other.isDisabled("#chat-input"), "the prompt box was enabled after a run");
      execFileSync(bin, ["token", "revoke", "colleague", "--state-dir", stateDir], { env: { ...process.env, TETHER_TOKEN: token } });
      await waitChat(other, "error");
      assert.match(await other.textContent("#chat-status"), /revoked/);
    }, "-colleague");
  }),
);

test("links are clickable", { timeout: 60000 }, (t) =>
  withContext(t, async (ctx) => {
    const link = "https://example.invalid/x";
    await ctx.route("https://example.invalid/**", (route) =>
      route.fulfill({ status: 200, contentType: "text/html", body: "<title>linked</title>" }),
    );
    const page = await open(ctx);
    await waitState(page, "connected");
    await waitPrompt(page); // typed before it, the prompt would land inside the line
    await type(page, "echo see https://example.invalid/x now");
    await waitText(page, String.raw`\nsee https://example\.invalid/x now`);
    const { x, y } = await pointAt(page, `see ${link} now`, 4 + 5);
    // Hovering underlines it, shows the pointer and says where it goes.
    await page.mouse.move(x - 30, y - 30);
    await page.mouse.move(x, y, { steps: 4 });
    await page.waitForFunction(() => document.querySelector("#terminal .xterm-screen").classList.contains("xterm-cursor-pointer"), null, {
      timeout: wait,
    });
    assert.equal(await page.textContent("#toast"), `click to open ${link}`);
    const [popup] = await Promise.all([ctx.waitForEvent("page", { timeout: wait }), page.mouse.click(x, y)]);
    await popup.waitForLoadState();
    assert.equal(popup.url(), link);
    assert.equal(await popup.evaluate(() => window.opener), null, "the linked page has a handle on the terminal page");
  }),
);

test("copy, search and font size", { timeout: 60000 }, (t) =>
  withContext(t, async (ctx) => {
    await ctx.grantPermissions(["clipboard-read", "clipboard-write"], { origin: new URL(url).origin });
    const page = await open(ctx);
    await waitState(page, "connected");
    // Typed before the shell's prompt, the prompt would land inside the
    // echoed command line ("echo one need# le two") and leave one match.
    await waitPrompt(page);
    await type(page, "echo one needle two");
    await waitText(page, "\none needle two");

    // Ctrl+Shift+F finds (and selects) the word; Ctrl+Shift+C copies it.
    await page.keyboard.press("Control+Shift+F");
    assert.ok(await page.isVisible("#search"), "no search box");
    await page.keyboard.type("needle");
    // Two matches: the command line and its output.
    await page.waitForFunction(() => /^[12] of 2$/.test(document.getElementById("search-count").textContent), null, { timeout: wait });
    assert.equal(await page.evaluate(() => window.tether.term.getSelection()), "needle");
    await page.keyboard.press("Escape");
    assert.ok(!(await page.isVisible("#search")), "Escape left the search box open");
    // A half-typed line, then Ctrl+Shift+C: it copies, and it is not ^C
    // (which would throw the half line away).
    await page.keyboard.type("echo ali");
    await waitText(page, String.raw`[$#] echo ali(?:\n|$)`);
    await page.evaluate(() => navigator.clipboard.writeText("before"));
    await page.evaluate(() => window.tether.term.selectAll());
    const all = await page.evaluate(() => window.tether.term.getSelection());
    assert.match(all, /one needle two/);
    await page.keyboard.press("Control+Shift+C");
    await page.waitForFunction((want) => navigator.clipboard.readText().then((got) => got === want), all, { timeout: wait });
    await type(page, "ve");
    await waitText(page, "\nalive\n");

    // Copy on select: a double-click selects a word and copies it.
    await page.check("#copy-on-select");
    const { x, y } = await pointAt(page, "one needle two", 6);
    await page.mouse.dblclick(x, y);
    await page.waitForFunction(() => navigator.clipboard.readText().then((got) => got === "needle"), null, { timeout: wait });
    assert.equal(await page.evaluate(() => localStorage.getItem("tether.copyOnSelect")), "1");

    // Font size: Ctrl+= and the buttons; it lasts across a reload.
    const size = () => page.evaluate(() => window.tether.term.options.fontSize);
    assert.equal(await size(), 14);
    await page.keyboard.press("Control+Equal");
    assert.equal(await size(), 15);
    await page.click("#font-up");
    assert.equal(await size(), 16);
    assert.equal(await page.textContent("#font-size"), "16");
    await page.reload();
    await waitState(page, "connected");
    assert.equal(await size(), 16, "the font size did not last across a reload");
    await page.evaluate(() => window.tether.term.focus());
    await page.keyboard.press("Control+Minus");
    assert.equal(await size(), 15);
    await page.keyboard.press("Control+0");
    assert.equal(await size(), 14);
  }),
);

// The page's theme: foreground and background of a cell (app.js).
const FG = [0xd4, 0xd4, 0xd4];
const BG = [0x1e, 0x1e, 0x1e];

// cellPixels screenshots the terminal's screen and returns, for each
// column of the visible row whose text is exactly line, what is lit in
// that cell: a pixel is lit when it is at least a quarter of the way from
// the background to the foreground colour in every channel. Each cell's
// outermost pixel columns are left out, so a neighbour's antialiased
// edge does not count. For each cell: lit (lit pixels in the cell),
// bottom (lit pixels in its lower half), cover (the share of its pixel
// columns with a lit pixel in its lower half), max (the brightest green
// value). null when the row is not on screen.
async function cellPixels(page, line) {
  const where = await page.evaluate((line) => {
    const t = window.tether.term;
    const b = t.buffer.active;
    for (let y = t.rows - 1; y >= 0; y--) {
      if (b.getLine(b.viewportY + y).translateToString(true) === line) return { y, cols: t.cols, rows: t.rows };
    }
    return null;
  }, line);
  if (!where) return null;
  const png = await page.locator("#terminal .xterm-screen").screenshot({ animations: "disabled", caret: "hide" });
  return page.evaluate(
    async ({ b64, where, n, fg, bg }) => {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const img = await createImageBitmap(new Blob([bytes], { type: "image/png" }));
      const canvas = new OffscreenCanvas(img.width, img.height);
      const g = canvas.getContext("2d", { willReadFrequently: true });
      g.drawImage(img, 0, 0);
      // The screenshot is in device pixels; the screen is cols × rows cells.
      const cw = img.width / where.cols;
      const ch = img.height / where.rows;
      const lit = (d, i) => [0, 1, 2].every((k) => d[i + k] >= bg[k] + (fg[k] - bg[k]) / 4);
      const cells = [];
      for (let x = 0; x < n; x++) {
        const x0 = Math.ceil(x * cw) + 1;
        const x1 = Math.floor((x + 1) * cw) - 1;
        const y0 = Math.ceil(where.y * ch);
        const y1 = Math.floor((where.y + 1) * ch);
        const mid = Math.floor((where.y + 0.5) * ch);
        const d = g.getImageData(x0, y0, x1 - x0, y1 - y0).data;
        const w = x1 - x0;
        let all = 0;
        let low = 0;
        let max = 0;
        const cols = new Set();
        for (let y = 0; y < y1 - y0; y++) {
          for (let c = 0; c < w; c++) {
            const i = (y * w + c) * 4;
            max = Math.max(max, d[i + 1]);
            if (!lit(d, i)) continue;
            all++;
            if (y0 + y >= mid) {
              low++;
              cols.add(c);
            }
          }
        }
        cells.push({ lit: all, bottom: low, cover: cols.size / w, max });
      }
      return { cells, cell: [cw, ch] };
    },
    { b64: png.toString("base64"), where, n: line.length, fg: FG, bg: BG },
  );
}

// underscoresLit prints line (made of letters, underscores and spaces)
// with printf and waits until every letter's cell is lit in a screenshot
// (the renderer has drawn the row); it then asserts that each
// underscore's cell is lit across its lower half and that each space's
// cell has no lit pixel. what names the case in the messages.
async function underscoresLit(page, line, what) {
  // The rows of the whole buffer that are exactly line: the new one is
  // printed when there is one more.
  const count = ([line, before]) => {
    const b = window.tether.term.buffer.active;
    let n = 0;
    for (let y = 0; y < b.length; y++) if (b.getLine(y).translateToString(true) === line) n++;
    return before === undefined ? n : n > before;
  };
  const before = await page.evaluate(count, [line]);
  await type(page, `printf '%s\\n' '${line}'`);
  let got = null;
  try {
    await page.waitForFunction(count, [line, before], { timeout: wait });
    // Drawn when every letter shows: poll screenshots (bounded by wait).
    for (const deadline = Date.now() + wait; ; ) {
      got = await cellPixels(page, line);
      if (got && [...line].every((c, i) => !/[a-z]/.test(c) || got.cells[i].lit > 0)) break;
      if (Date.now() > deadline) throw new Error("the row's letters were never drawn");
    }
  } catch (err) {
    throw new Error(`${what}: ${err.message}; last cells ${JSON.stringify(got)}`);
  }
  const bad = [];
  [...line].forEach((c, i) => {
    const p = got.cells[i];
    if (c === "_" && !(p.bottom > 0 && p.cover >= 0.8)) bad.push(`column ${i} "_" is not drawn (lit ${p.lit}, in its lower half ${p.bottom}, across ${Math.round(p.cover * 100)}% of its width, brightest ${p.max})`);
    if (c === " " && p.lit > 0) bad.push(`column ${i} " " has ${p.lit} lit pixels`);
  });
  const cells = `cells ${got.cell.map((v) => v.toFixed(2)).join("×")} device px`;
  assert.deepEqual(bad, [], `${what} (${cells})`);
  const under = got.cells.filter((_, i) => line[i] === "_");
  return `${what}: ${cells}, the dimmest underscore's brightest pixel ${Math.min(...under.map((p) => p.max))} (background ${BG[1]}, foreground ${FG[1]})`;
}

test("underscores are drawn at every font size", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await open(ctx);
    await waitState(page, "connected");
    await waitPrompt(page);
    const size = () => page.evaluate(() => window.tether.term.options.fontSize);
    assert.equal(await size(), 14, "not the default font size");
    const line = "snake_case_name __dunder__ _ x";
    t.diagnostic(await underscoresLit(page, line, "at the default size 14"));
    // The sizes around it, with the page's own buttons.
    await page.click("#font-down");
    await page.click("#font-down");
    for (let n = 12; n <= 18; n++) {
      assert.equal(await size(), n);
      t.diagnostic(await underscoresLit(page, line, `at size ${n}`));
      await page.click("#font-up");
    }
  }),
);

test("New terminal keeps the old one; switch back; close one", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await open(ctx);
    await waitState(page, "connected");
    const first = await page.evaluate(() => window.tether.attach());
    await type(page, "echo first=$$");
    const pid1 = await waitText(page, String.raw`first=(\d+)`);

    await page.click("#new-terminal");
    await waitState(page, "connected");
    const second = await page.evaluate(() => window.tether.attach());
    assert.notEqual(second, first);
    assert.equal(await page.evaluate(() => localStorage.getItem("tether.attach")), second);
    await type(page, "echo second=$$");
    const pid2 = await waitText(page, String.raw`second=(\d+)`);
    assert.notEqual(pid2, pid1);
    const tokens = (await page.evaluate(() => window.tether.terminals())).map((e) => e.token);
    assert.deepEqual(tokens.sort(), [first, second].sort(), "the list does not hold both terminals");

    // Switch back to the first from the menu: its shell, its screen.
    await page.click("#terminals");
    await page.click(`#terminals-list li[data-token="${first}"] .pick`);
    await waitState(page, "connected");
    assert.equal(await page.evaluate(() => window.tether.attach()), first);
    await waitText(page, `first=${pid1}\\b`);
    await type(page, "echo still=$$");
    assert.equal(await waitText(page, String.raw`still=(\d+)`), pid1);

    // A reload stays on this tab's terminal.
    await page.reload();
    await waitState(page, "connected");
    assert.equal(await page.evaluate(() => window.tether.attach()), first);

    // Close the second (not shown): the dialog says the shell keeps
    // running and shows its token; Forget drops it.
    await page.click("#terminals");
    await page.click(`#terminals-list li[data-token="${second}"] .close`);
    assert.ok(await page.isVisible("#close-dialog"));
    assert.match(await page.textContent("#close-dialog"), /keeps\s+running/);
    assert.equal(await page.textContent("#close-token"), second);
    assert.ok(!(await page.isVisible("#close-exit")), "Type exit offered for a terminal this tab does not show");
    await page.click("#close-forget");
    assert.deepEqual((await page.evaluate(() => window.tether.terminals())).map((e) => e.token), [first]);
    assert.equal(await page.evaluate(() => window.tether.attach()), first);

    // Close the shown one with Type exit: the shell ends (4410), the
    // terminal is forgotten and the tab moves to a new one.
    await page.click("#terminals");
    await page.click(`#terminals-list li[data-token="${first}"] .close`);
    assert.ok(await page.isVisible("#close-exit"));
    await page.click("#close-exit");
    await page.waitForFunction((tok) => window.tether.attach() !== tok && document.body.dataset.state === "connected", first, {
      timeout: wait,
    });
    const left = (await page.evaluate(() => window.tether.terminals())).map((e) => e.token);
    assert.ok(!left.includes(first), `the closed terminal is still listed: ${left}`);
    assert.equal(left.length, 1);
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

    // The cookie is named for this listener's port, and holds a page
    // credential, never the access token itself.
    const all = await ctx.cookies();
    const cookies = all.filter((c) => c.name === `tether_${new URL(url).port}`);
    assert.equal(cookies.length, 1, `cookies: ${JSON.stringify(all)}`);
    assert.equal(all.length, 1, `more cookies than the page's: ${JSON.stringify(all)}`);
    const c = cookies[0];
    assert.notEqual(c.value, token, "the cookie holds the access token");
    assert.match(c.value, /^[0-9a-f]{32}$/);
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
      // A page load attaches without a cursor: its screen is empty.
      assert.ok(!/[?&]offset=/.test(s), `a page load attached with a cursor: ${s}`);
    }
  }),
);

test("a wrong or missing token gets the 401 page and no cookie", { timeout: 60000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await ctx.newPage();
    for (const [target, says] of [
      [new URL("/?token=wrong", url).href, "not one this server accepts"],
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

test("signed into two hosts on two ports of one machine: both stay signed in", { timeout: 120000 }, async (t) => {
  const dir = path.join(tmp, "second-state");
  mkdirSync(dir, { mode: 0o700 });
  const h = spawnTether(dir, ["--listen", "127.0.0.1:0", "--pty-command", "/bin/sh", "--stop-ptys"], () => {});
  try {
    const { url: url2, token: token2 } = await h.started;
    assert.notEqual(token2, token);
    await withContext(t, async (ctx) => {
      const page = await ctx.newPage();
      // Sign into the first host, then the second, in one browser.
      assert.equal((await page.goto(url)).status(), 200);
      await waitState(page, "connected");
      const page2 = await ctx.newPage();
      assert.equal((await page2.goto(url2)).status(), 200);
      await waitState(page2, "connected");
      const names = (await ctx.cookies()).map((c) => c.name).sort();
      assert.deepEqual(names, [`tether_${new URL(url).port}`, `tether_${new URL(url2).port}`].sort());
      // The bare URLs of both (bookmarks) still open their pages, and
      // their terminals connect: neither sign-in replaced the other.
      for (const [p, u] of [[page, url], [page2, url2]]) {
        const resp = await p.goto(new URL("/", u).href);
        assert.equal(resp.status(), 200, `the bare URL of ${u} after signing into both`);
        await waitState(p, "connected");
      }
    });
  } finally {
    await stopTether(h.proc);
  }
});

// ---- the chat view (/api/ws)

// waitChat waits for the chat's connection state (document.body.dataset.chat).
async function waitChat(page, state) {
  try {
    await page.waitForFunction((s) => document.body.dataset.chat === s, state, { timeout: wait });
  } catch (err) {
    const now = await page
      .evaluate(() => `chat ${document.body.dataset.chat}, closeCode ${document.body.dataset.chatCloseCode}, status "${document.getElementById("chat-status").textContent}"`)
      .catch((e) => e.message);
    throw new Error(`waiting for chat state ${state}: ${err.message.split("\n")[0]}; page has ${now}`);
  }
}

// waitRun waits for the open chat's run state (#chat-main data-run):
// idle, working, complete, interrupted, failed.
async function waitRun(page, state) {
  try {
    await page.waitForFunction((s) => document.getElementById("chat-main").dataset.run === s, state, { timeout: wait });
  } catch (err) {
    const now = await page
      .evaluate(() => `run ${document.getElementById("chat-main").dataset.run}, "${document.getElementById("chat-run").textContent}", note "${document.getElementById("chat-note").textContent}"`)
      .catch((e) => e.message);
    throw new Error(`waiting for run state ${state}: ${err.message.split("\n")[0]}; page has ${now}`);
  }
}

// openChatView opens the page and switches it to the chat view.
async function openChatView(ctx, target) {
  const page = await ctx.newPage();
  const resp = await page.goto(target || url);
  assert.equal(resp.status(), 200);
  await page.click("#view-chat");
  await waitChat(page, "connected");
  return page;
}

// messages returns the chat log's rows as [role, text].
function messages(page) {
  return page.evaluate(() =>
    [...document.querySelectorAll("#chat-log > .msg")].map((li) => [li.classList.contains("user") ? "user" : "assistant", li.querySelector(".text").textContent]),
  );
}

// recordChat records, from now on, every text node added to an
// assistant row's text (each delta is one) with its row and whether the
// prompt box and Stop were disabled then, and every chat connection
// state with the number of texts added by then.
function recordChat(page) {
  return page.evaluate(() => {
    const rec = { adds: [], states: [] };
    window.chatRec = rec;
    let rows = 0;
    new MutationObserver((ms) => {
      for (const m of ms) {
        for (const n of m.addedNodes) {
          const row = m.target.parentElement;
          if (n.nodeType !== Node.TEXT_NODE || !m.target.classList.contains("text") || !row.classList.contains("assistant")) continue;
          if (!row.dataset.rec) row.dataset.rec = String(++rows);
          rec.adds.push({
            row: row.dataset.rec,
            text: n.data,
            inputDisabled: document.getElementById("chat-input").disabled,
            stopDisabled: document.getElementById("chat-stop").disabled,
          });
        }
      }
    }).observe(document.getElementById("chat-log"), { childList: true, subtree: true });
    new MutationObserver(() => rec.states.push([document.body.dataset.chat, rec.adds.length])).observe(document.body, {
      attributes: true,
      attributeFilter: ["data-chat"],
    });
  });
}

function recorded(page) {
  return page.evaluate(() => window.chatRec);
}

// prompt types text into the prompt box (lines joined with Shift+Enter)
// and sends it with Enter.
async function prompt(page, ...lines) {
  await page.waitForFunction(() => !document.getElementById("chat-input").disabled, null, { timeout: wait });
  await page.focus("#chat-input");
  for (const [i, l] of lines.entries()) {
    if (i > 0) await page.keyboard.press("Shift+Enter");
    await page.keyboard.type(l);
  }
  await page.keyboard.press("Enter");
}

test("chat: a new chat streams its answer; the terminal keeps its shell; a reload opens the same chat", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const ptySockets = [];
    ctx.on("page", (p) => p.on("websocket", (ws) => ws.url().includes("/api/pty") && ptySockets.push(ws.url())));
    const page = await open(ctx);
    await waitState(page, "connected");
    await waitPrompt(page); // typed before it, the prompt would land inside the line
    await type(page, "echo pid=$$");
    const pid = await waitText(page, String.raw`pid=(\d+)`);

    await page.click("#view-chat");
    assert.equal(await page.getAttribute("#view-chat", "aria-selected"), "true");
    // The terminal stays laid out under the chat, unseen.
    assert.equal(await page.evaluate(() => getComputedStyle(document.getElementById("terminal")).visibility), "hidden");
    await waitChat(page, "connected");
    await page.click("#chat-new");
    assert.equal(await page.textContent("#chat-title"), "New chat");
    await recordChat(page);
    await prompt(page, "hello brave world");
    await waitRun(page, "complete");
    assert.deepEqual(await messages(page), [
      ["user", "hello brave world"],
      ["assistant", "hello brave world"],
    ]);
    // The answer came word by word into one row, while the prompt box
    // and Send were disabled and Stop enabled.
    const rec = await recorded(page);
    assert.deepEqual(
      rec.adds.map((a) => a.text),
      ["hello ", "brave ", "world"],
      "the answer did not stream as its deltas",
    );
    assert.ok(rec.adds.every((a) => a.row === "1" && a.inputDisabled && !a.stopDisabled), `while streaming: ${JSON.stringify(rec.adds)}`);
    await page.waitForFunction(() => !document.getElementById("chat-input").disabled && document.activeElement.id === "chat-input", null, { timeout: wait });
    const key = await page.evaluate(() => window.tether.chat.session().key);
    assert.match(key, /^\d{8}_\d{6}_[0-9a-f]{6}$/);
    // The list has it first, titled with its first prompt.
    await page.waitForFunction(
      (key) => {
        const first = document.querySelector("#chat-list li");
        return first && first.dataset.key === key && /2 messages/.test(first.textContent);
      },
      key,
      { timeout: wait },
    );
    assert.equal(await page.textContent("#chat-list li .name"), "hello brave world");
    assert.equal(await page.getAttribute("#chat-list li .pick", "aria-current"), "true");

    // Shift+Enter is a new line, Enter sends.
    await prompt(page, "line one", "line two");
    await page.waitForFunction(() => document.querySelectorAll("#chat-log > .msg").length === 4, null, { timeout: wait });
    await waitRun(page, "complete");

    // Back to the terminal: the same shell, on the same socket.
    await page.click("#view-terminal");
    assert.equal(await page.evaluate(() => document.body.dataset.view), "terminal");
    await type(page, "echo again=$$");
    assert.equal(await waitText(page, String.raw`again=(\d+)`), pid);
    assert.equal(ptySockets.length, 1, `the terminal reattached: ${ptySockets.join(", ")}`);

    // A reload shows the view and the chat the tab showed.
    await page.click("#view-chat");
    await page.reload();
    await waitChat(page, "connected");
    assert.equal(await page.evaluate(() => document.body.dataset.view), "chat");
    await waitRun(page, "idle");
    assert.equal(await page.evaluate(() => window.tether.chat.session().key), key);
    assert.equal(await page.textContent("#chat-title"), "hello brave world");
    assert.deepEqual(await messages(page), [
      ["user", "hello brave world"],
      ["assistant", "hello brave world"],
      ["user", "line one\nline two"],
      ["assistant", "line one\nline two"],
    ]);
    await page.waitForFunction(() => !document.getElementById("chat-input").disabled, null, { timeout: wait });
    assert.equal(await waitText(page, String.raw`again=(\d+)`), pid, "the reloaded page's terminal is another shell");
  }),
);

test("chat: Stop interrupts the answer", { timeout: 60000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await openChatView(ctx);
    await page.click("#chat-new");
    await recordChat(page);
    const words = Array.from({ length: 100 }, (_, i) => `s${i}`).join(" ");
    await prompt(page, words);
    await page.waitForFunction(() => window.chatRec.adds.length >= 2, null, { timeout: wait });
    assert.equal(await page.isEnabled("#chat-stop"), true);
    await page.click("#chat-stop");
    await waitRun(page, "interrupted");
    const [, answer] = (await messages(page))[1];
    assert.ok(answer.length > 0 && words.startsWith(answer) && answer.length < words.length, `the stopped answer: ${JSON.stringify(answer)}`);
    assert.match(await page.textContent("#chat-run"), /stopped/);
    assert.equal(await page.isEnabled("#chat-stop"), false);
    await page.waitForFunction(() => !document.getElementById("chat-input").disabled, null, { timeout: wait });
  }),
);

// The transport is swapped (tether plugins reload ws: every socket is
// closed with 1012) while the answer streams. The page reconnects,
// resumes the chat and asks session.events.since for what it missed:
// the answer is whole, in the row it was streaming into, every delta
// added once.
test("chat: a dropped socket mid-answer loses and repeats nothing", { timeout: 60000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await openChatView(ctx);
    await page.click("#chat-new");
    await recordChat(page);
    const words = Array.from({ length: 30 }, (_, i) => `w${String(i + 1).padStart(2, "0")}`).join(" ");
    await prompt(page, words);
    await page.waitForFunction(() => window.chatRec.adds.length >= 3, null, { timeout: wait });
    execFileSync(bin, ["plugins", "reload", "ws", "--state-dir", stateDir], { stdio: ["ignore", "ignore", "inherit"] });
    await waitRun(page, "complete");
    await waitChat(page, "connected");

    const rec = await recorded(page);
    const lost = rec.states.find(([s]) => s === "reconnecting");
    assert.ok(lost, `the chat's socket did not drop: ${JSON.stringify(rec.states)}`);
    assert.ok(lost[1] < 30, `the socket dropped after the whole answer: ${JSON.stringify(rec.states)}`);
    assert.equal(await page.evaluate(() => document.body.dataset.chatCloseCode), "1012");
    const catchUp = await page.evaluate(() => window.tether.chat.catchUp());
    assert.ok(catchUp && catchUp.events > 0, `no missed event came from session.events.since: ${JSON.stringify(catchUp)}`);
    assert.deepEqual(await messages(page), [
      ["user", words],
      ["assistant", words],
    ]);
    assert.ok(
      rec.adds.every((a) => a.row === "1"),
      "the answer was redrawn instead of caught up",
    );
    assert.equal(rec.adds.map((a) => a.text).join(""), words, "a delta was lost or added twice");
    assert.equal(rec.adds.length, 30);
    await waitState(page, "connected"); // the terminal is back too
  }),
);

// The ACP test kit (testing/acp, on the official SDK; `npm ci` there
// installs it): its agent (agent.mjs) for a second host, and its client
// (client.mjs) as another client.
const acpKit = path.join(repo, "testing", "acp");

// withACPHost runs fn with the URL of a second host (its own state dir
// name) whose agent is the ACP test kit's (with agentArgs more of its
// flags), with no PTYs, and the path of the agent's log (every message it
// got); on a failure it prints that host's stderr.
async function withACPHost(t, name, fn, agentArgs = []) {
  assert.ok(
    existsSync(path.join(acpKit, "agent.mjs")) && existsSync(path.join(acpKit, "node_modules", "@agentclientprotocol", "sdk", "package.json")),
    `the ACP test kit is missing: ${acpKit}/agent.mjs and its packages (npm ci in testing/acp)`,
  );
  const dir = path.join(tmp, name + "-state");
  mkdirSync(dir, { mode: 0o700 });
  const agentLog = path.join(tmp, name + "-agent.log");
  const agentCommand = [process.execPath, path.join(acpKit, "agent.mjs"), "--dir", path.join(tmp, name + "-agent"), "--log", agentLog, ...agentArgs]
    .map((a) => `'${a}'`)
    .join(" ");
  const acpLog = [];
  const h = spawnTether(dir, ["--listen", "127.0.0.1:0", "--pty-command", "", "--agent", "acp", "--agent-command", agentCommand], (l) => {
    acpLog.push(l);
    if (acpLog.length > 200) acpLog.shift();
  });
  try {
    const { url: acpURL } = await h.started;
    await fn(acpURL, agentLog);
  } catch (err) {
    t.diagnostic("ACP host's stderr, last lines:");
    for (const line of acpLog.slice(-20)) t.diagnostic(line);
    throw err;
  } finally {
    await stopTether(h.proc);
  }
}

// rpc makes one JSON-RPC call on a socket of its own to the gateway of
// page's host (signed in with the page's cookie) and returns the result.
function rpc(page, method, params) {
  return page.evaluate(
    ([method, params]) =>
      new Promise((resolve, reject) => {
        const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/api/ws");
        ws.onmessage = (ev) => {
          const m = JSON.parse(ev.data);
          if (m.method === "event" && m.params.type === "gateway.ready") ws.send(JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }));
          else if (m.id === 1) {
            ws.close();
            if (m.error) reject(new Error(`${method}: ${m.error.code} ${m.error.message}`));
            else resolve(m.result);
          }
        };
        ws.onclose = (ev) => reject(new Error(`${method}: the socket closed (${ev.code})`));
      }),
    [method, params],
  );
}

// acpClient runs the ACP test kit's client (../acp/client.mjs, on the
// official SDK) against the /acp endpoint of the host at hostURL with its
// token, and returns what it prints.
function acpClient(hostURL, hostToken, scenario, ...flags) {
  const target = new URL("/acp", hostURL.replace(/^http/, "ws")).href;
  const env = { ...process.env, ACP_TEST_TOKEN: hostToken };
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [path.join(acpKit, "client.mjs"), scenario, target, ...flags], { env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let errText = "";
    p.stdout.on("data", (b) => (out += b));
    p.stderr.on("data", (b) => (errText += b));
    p.once("error", reject);
    p.once("exit", (code) => {
      let r;
      try {
        r = JSON.parse(out);
      } catch {
        reject(new Error(`client.mjs ${scenario} exited ${code}: ${out}\n${errText.slice(-2000)}`));
        return;
      }
      if (code !== 0 || (r.errors && r.errors.length)) reject(new Error(`client.mjs ${scenario} exited ${code}: ${JSON.stringify(r.errors)}\n${errText.slice(-2000)}`));
      else resolve(r);
    });
  });
}

// listRefreshes is the number of session.list answers the chat rendered.
function listRefreshes(page) {
  return page.evaluate(() => window.tether.chat.listRefreshes());
}

// listEntry is the chat list's entry of key: its title, its meta line and
// its last activity; null when it is not listed.
function listEntry(page, key) {
  return page.evaluate((key) => {
    const li = document.querySelector(`#chat-list li[data-key="${key}"]`);
    return li && { name: li.querySelector(".name").textContent, meta: li.querySelector(".meta").textContent, lastActive: Number(li.dataset.lastActive) };
  }, key);
}

test("chat: the list stays current without a reload: chats named by their first prompt, none without a message, most recently active first", { timeout: 120000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await openChatView(ctx);
    await page.waitForFunction(() => document.querySelector("#chat-list li") || document.getElementById("chat-list-note").textContent, null, { timeout: wait });

    // Another client (an ACP client on /acp): a bare session/new, never
    // prompted, then a session made and prompted with no title given.
    const bare = (await acpClient(url, token, "new")).sessionId;
    const named = (await acpClient(url, token, "prompt", "--text", "named by its first prompt")).sessionId;
    // The page views neither (no event comes): the list shows the new chat
    // by itself, named by its first prompt.
    await page.waitForSelector(`#chat-list li[data-key="${named}"]`, { timeout: wait });
    assert.equal((await listEntry(page, named)).name, "named by its first prompt");
    // session.list has both; the list leaves out the one with no message.
    let stored = (await rpc(page, "session.list", {})).sessions;
    assert.deepEqual(
      stored.filter((s) => s.id === bare).map((s) => [s.title, s.message_count]),
      [["", 0]],
      "the bare session/new is not stored as an untitled session with no message",
    );
    assert.equal(await listEntry(page, bare), null, "a chat with no message is listed");
    assert.ok(!/\b0 messages\b/.test(await page.textContent("#chat-list")), "an entry says 0 messages");

    // The chat this tab has open is listed even with no message; when
    // another client sends its first prompt, the list and the header take
    // the title the host gave it, without a reload.
    await page.evaluate((k) => sessionStorage.setItem("tether.tab.chat", k), bare);
    await page.reload();
    await waitChat(page, "connected");
    await page.waitForFunction((k) => window.tether.chat.session()?.key === k && window.tether.chat.session().synced, bare, { timeout: wait });
    await page.waitForSelector(`#chat-list li[data-key="${bare}"]`, { timeout: wait });
    assert.deepEqual(await listEntry(page, bare).then((e) => [e.name, /0 messages/.test(e.meta)]), ["Untitled chat", true]);
    assert.equal(await page.textContent("#chat-title"), "Untitled chat");
    // 30 words: the echo agent takes 1.5 s, so this chat is active seconds
    // after the other one (last activity is in whole seconds).
    const words = Array.from({ length: 30 }, (_, i) => `w${String(i + 1).padStart(2, "0")}`).join(" ");
    await acpClient(url, token, "prompt", "--session", bare, "--text", words);
    stored = (await rpc(page, "session.list", {})).sessions;
    const title = stored.find((s) => s.id === bare).title;
    assert.match(title, /^w01 w02 /);
    await page.waitForFunction(
      ([k, title]) => {
        const li = document.querySelector(`#chat-list li[data-key="${k}"]`);
        return li && li.querySelector(".name").textContent === title && document.getElementById("chat-title").textContent === title;
      },
      [bare, title],
      { timeout: wait },
    );
    assert.deepEqual(await messages(page), [
      ["user", words],
      ["assistant", words],
    ]);

    // Each entry shows when it was last active (session.list's
    // last_active, the end of its last run), most recent first: the chat
    // made first is now above the other. (Only these two are compared: a
    // run of an earlier test may still end meanwhile and go above both.)
    stored = (await rpc(page, "session.list", {})).sessions;
    const want = [bare, named].map((k) => [k, stored.find((s) => s.id === k).last_active]);
    assert.ok(want[0][1] > want[1][1], `session.list: ${JSON.stringify(want)}, want the bare chat active after the named one`);
    await page.waitForFunction(
      (want) =>
        JSON.stringify(
          [...document.querySelectorAll("#chat-list li")]
            .filter((li) => want.some(([k]) => k === li.dataset.key))
            .map((li) => [li.dataset.key, Number(li.dataset.lastActive)]),
        ) === JSON.stringify(want),
      want,
      { timeout: wait },
    );
    for (const key of [bare, named]) assert.match((await listEntry(page, key)).meta, /^just now · 2 messages$/);
    const first = stored.find((s) => s.id === bare);
    assert.ok(first.last_active > stored.find((s) => s.id === named).last_active, "the chat prompted last is not the latest active");
    assert.ok(first.last_active > first.started_at, `last_active ${first.last_active} is not after started_at ${first.started_at}`);

    // Polled while seen, one request at a time: two more answers take at
    // least the 5 s between them.
    const n0 = await listRefreshes(page);
    const t0 = Date.now();
    await page.waitForFunction((n) => window.tether.chat.listRefreshes() >= n + 2, n0, { timeout: wait });
    assert.ok(Date.now() - t0 >= 5000, `two list answers within ${Date.now() - t0} ms with nothing happening`);
    // Not in the terminal view: longer than an interval with no request
    // (but for one already on its way); shown again, the list is asked for.
    await page.click("#view-terminal");
    const n1 = await listRefreshes(page);
    await new Promise((r) => setTimeout(r, 6500)); // nothing to wait on but the clock
    assert.ok((await listRefreshes(page)) <= n1 + 1, "the list was polled in the terminal view");
    const n2 = await listRefreshes(page);
    await page.click("#view-chat");
    await page.waitForFunction((n) => window.tether.chat.listRefreshes() > n, n2, { timeout: 4000 });
  }),
);

// chatLog returns the chat log's rows as they are shown: role, text,
// status, tool lines and the line that says how the run ended.
function chatLog(page) {
  return page.evaluate(() =>
    [...document.querySelectorAll("#chat-log > .msg")].map((li) => ({
      role: li.classList.contains("user") ? "user" : "assistant",
      text: li.querySelector(".text").textContent,
      status: li.dataset.status || "",
      tools: [...li.querySelectorAll(".tool")].map((x) => x.textContent),
      end: li.querySelector(".end") ? li.querySelector(".end").textContent : "",
    })),
  );
}

test("chat: a reopened ACP chat shows its tool calls and its failed turns as they were live", { timeout: 120000 }, (t) =>
  withACPHost(t, "acp-reopen", (acpURL) =>
    withContext(t, (ctx) =>
      withContext(
        t,
        async (ctx2) => {
          const page = await openChatView(ctx, acpURL);
          await page.click("#chat-new");
          await prompt(page, "tool"); // a tool call (pending, then completed) and "tool done"
          await waitRun(page, "complete");
          await prompt(page, "crash"); // the agent process exits mid-turn
          await waitRun(page, "failed");
          await prompt(page, "fail"); // the restarted agent answers with an error
          await page.waitForFunction(() => document.querySelectorAll("#chat-log > .msg").length === 6 && !window.tether.chat.session().running, null, { timeout: wait });
          await waitRun(page, "failed");
          const live = await chatLog(page);
          const run = await page.textContent("#chat-run");
          t.diagnostic(`live: ${JSON.stringify(live)}; header "${run}"`);
          assert.deepEqual(
            live.map((r) => [r.role, r.status, r.tools]),
            [
              ["user", "", []],
              ["assistant", "complete", ["Tool: test tool — completed"]],
              ["user", "", []],
              ["assistant", "failed", []],
              ["user", "", []],
              ["assistant", "failed", []],
            ],
          );
          assert.equal(live[1].text, "tool done");
          assert.match(run, /^failed: \S/);
          const key = await page.evaluate(() => window.tether.chat.session().key);

          // Reopened (a reload draws from the snapshot), and in another
          // client from its list: the same rows, tool lines and failures.
          await page.reload();
          await waitChat(page, "connected");
          const other = await openChatView(ctx2, acpURL);
          await other.waitForSelector(`#chat-list li[data-key="${key}"]`, { timeout: wait });
          await other.click(`#chat-list li[data-key="${key}"] .pick`);
          for (const [p, who] of [
            [page, "after a reload"],
            [other, "in another client"],
          ]) {
            await p.waitForFunction((k) => window.tether.chat.session()?.key === k && window.tether.chat.session().synced, key, { timeout: wait });
            assert.deepEqual(await chatLog(p), live, who);
            assert.equal(await p.textContent("#chat-run"), run, who);
          }
          // Each failed turn's row says why, the crash and the error apart.
          for (const i of [3, 5]) assert.match(live[i].end, /^Failed: \S/, `row ${i} does not say why its run failed`);
          assert.notEqual(live[3].end, live[5].end, "the crash and the error say the same");
        },
        "-client2",
      ),
    ),
  ),
);

// Behind an ACP agent that takes images and embedded resources, the
// Chat view's Attach offers files: an image becomes an image block, a
// text file an embedded resource, and the prompt reaches the agent with
// them as sent (the agent's log); the prompt's row shows the thumbnail
// and the file, also after a reload (from the stored prompt); a pasted
// image is attached like a chosen one. Behind the
// echo agent, which takes text only, there is no Attach.
test("chat: an attached image and file reach the ACP agent as content blocks", { timeout: 120000 }, async (t) => {
  await withContext(t, async (ctx) => {
    const page = await openChatView(ctx);
    await page.click("#chat-new");
    await page.waitForFunction(() => !document.getElementById("chat-input").disabled, null, { timeout: wait });
    assert.equal(await page.isHidden("#chat-attach"), true, "Attach shows behind the echo agent, which takes text only");
  });
  await withACPHost(
    t,
    "acp-attach",
    (acpURL, agentLog) =>
      withContext(t, async (ctx) => {
        const png = Buffer.from("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==", "base64");
        const page = await openChatView(ctx, acpURL);
        await page.click("#chat-new");
        await page.waitForSelector("#chat-attach:not([hidden]):not([disabled])", { timeout: wait });
        await page.setInputFiles("#chat-file", [
          { name: "shot.png", mimeType: "image/png", buffer: png },
          { name: "notes.txt", mimeType: "text/plain", buffer: Buffer.from("hello notes\n") },
        ]);
        await page.waitForFunction(() => document.querySelectorAll("#chat-attachments li").length === 2, null, { timeout: wait });
        await prompt(page, "look at these");
        await waitRun(page, "complete");
        assert.equal(await page.$$eval("#chat-attachments li", (l) => l.length), 0, "the attachments stay after the prompt was sent");
        const got = readFileSync(agentLog, "utf8")
          .split("\n")
          .filter(Boolean)
          .map((l) => JSON.parse(l))
          .filter((e) => e.dir === "in" && e.method === "session/prompt");
        assert.equal(got.length, 1);
        assert.deepEqual(got[0].params.prompt, [
          { type: "text", text: "look at these" },
          { type: "image", mimeType: "image/png", data: png.toString("base64"), uri: "file:///shot.png" },
          { type: "resource", resource: { uri: "file:///notes.txt", mimeType: "text/plain", text: "hello notes\n" } },
        ]);
        const shown = () =>
          page.$$eval("#chat-log > .msg.user .attached li", (l) =>
            l.map((li) => (li.dataset.type === "image" ? "image:" + li.querySelector("img").naturalWidth : li.textContent)),
          );
        await page.waitForFunction(() => [...document.querySelectorAll("#chat-log .attached img")].every((i) => i.complete), null, { timeout: wait });
        assert.deepEqual(await shown(), ["image:1", "📎 notes.txt"]);
        await page.reload();
        await page.click("#view-chat");
        await waitChat(page, "connected");
        await page.waitForSelector("#chat-log > .msg.user .attached li", { timeout: wait });
        await page.waitForFunction(() => [...document.querySelectorAll("#chat-log .attached img")].every((i) => i.complete), null, { timeout: wait });
        assert.deepEqual(await shown(), ["image:1", "📎 notes.txt"], "after a reload");

        // A pasted screenshot is attached too.
        await page.waitForFunction(() => !document.getElementById("chat-input").disabled, null, { timeout: wait });
        await page.evaluate((b64) => {
          const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
          const dt = new DataTransfer();
          dt.items.add(new File([bytes], "image.png", { type: "image/png" }));
          document.getElementById("chat-input").dispatchEvent(new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true }));
        }, png.toString("base64"));
        await page.waitForFunction(() => document.querySelectorAll("#chat-attachments li").length === 1, null, { timeout: wait });
        await prompt(page, "pasted");
        await page.waitForFunction(() => document.querySelectorAll("#chat-log > .msg.user").length === 2, null, { timeout: wait });
        await waitRun(page, "complete");
        const prompts = readFileSync(agentLog, "utf8")
          .split("\n")
          .filter(Boolean)
          .map((l) => JSON.parse(l))
          .filter((e) => e.dir === "in" && e.method === "session/prompt");
        assert.deepEqual(prompts.at(-1).params.prompt, [
          { type: "text", text: "pasted" },
          { type: "image", mimeType: "image/png", data: png.toString("base64"), uri: "file:///image.png" },
        ]);
      }),
    ["--prompt-caps", "image,embeddedContext"],
  );
});

// Web Push (docs/NOTIFICATIONS.md): on a host with --notify-push, the
// Chat view offers "Notify me"; a click registers the page's service
// worker (sw.js), subscribes and stores the subscription with
// push.subscribe — `tether notify test` then pushes to its endpoint. A
// headless Chromium here reaches no push service (Google's), so only
// PushManager.prototype.subscribe is stubbed: it hands back a
// subscription with keys made by WebCrypto and an endpoint at this test's
// own receiver; the service worker, the permission and the page's flow
// are the browser's own.
test("chat: Notify me registers the service worker and stores this browser's push subscription", { timeout: 120000 }, async (t) => {
  const pushes = [];
  const receiver = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      pushes.push({ url: req.url, headers: req.headers, bytes: Buffer.concat(chunks).length });
      res.writeHead(201).end();
    });
  });
  await new Promise((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  const endpoint = `http://127.0.0.1:${receiver.address().port}/push/browser-1`;
  const dir = path.join(tmp, "push-state");
  mkdirSync(dir, { mode: 0o700 });
  const log = [];
  const h = spawnTether(dir, ["--listen", "127.0.0.1:0", "--pty-command", "", "--notify-push", "--notify-push-insecure-endpoints"], (l) => {
    log.push(l);
    if (log.length > 200) log.shift();
  });
  try {
    const { url: pushURL } = await h.started;
    await withContext(t, async (ctx) => {
      await ctx.grantPermissions(["notifications"], { origin: new URL(pushURL).origin });
      await ctx.addInitScript((ep) => {
        const b64u = (buf) => btoa(String.fromCharCode(...new Uint8Array(buf))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
        if (!self.PushManager) return;
        PushManager.prototype.subscribe = async function (opts) {
          if (!opts || !opts.userVisibleOnly || !(opts.applicationServerKey instanceof Uint8Array) || opts.applicationServerKey.length !== 65) {
            throw new Error("subscribe without userVisibleOnly and the 65-byte VAPID key");
          }
          const pair = await crypto.subtle.generateKey({ name: "ECDH", namedCurve: "P-256" }, true, ["deriveBits"]);
          const keys = { p256dh: b64u(await crypto.subtle.exportKey("raw", pair.publicKey)), auth: b64u(crypto.getRandomValues(new Uint8Array(16))) };
          window.stubbedSubscribe = (window.stubbedSubscribe || 0) + 1;
          return { endpoint: ep, toJSON: () => ({ endpoint: ep, expirationTime: null, keys }) };
        };
      }, endpoint);
      const page = await openChatView(ctx, pushURL);
      await page.waitForSelector("#chat-notify:not([hidden])", { timeout: wait });
      assert.equal(await page.textContent("#chat-notify"), "Notify me");
      await page.click("#chat-notify");
      await page.waitForFunction(() => window.tether.chat.pushSubscribed() === 1, null, { timeout: wait });
      assert.equal(await page.textContent("#chat-notify"), "Notifying you");
      assert.equal(await page.evaluate(() => window.stubbedSubscribe), 1);
      const sw = await page.evaluate(async () => {
        const reg = await navigator.serviceWorker.getRegistration("./");
        return reg && reg.active ? new URL(reg.active.scriptURL).pathname : "";
      });
      assert.equal(sw, "/sw.js", "the page's service worker is registered and active");

      // Stored: the host's test notification is pushed to it (the
      // admin credential that signed the page in made it).
      // Not execFileSync: the receiver answers from this event loop.
      const out = await new Promise((resolve, reject) =>
        execFile(bin, ["notify", "test", "--state-dir", dir], { encoding: "utf8" }, (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stdout}${stderr}`)) : resolve(stdout))),
      );
      assert.match(out, /webpush.*pushed to 1 subscription/, out);
      assert.equal(pushes.length, 1, JSON.stringify(pushes));
      assert.equal(pushes[0].url, "/push/browser-1");
      assert.equal(pushes[0].headers["content-encoding"], "aes128gcm");
      assert.match(pushes[0].headers.authorization || "", /^vapid t=[\w-]+\.[\w-]+\.[\w-]+, k=[\w-]+$/);
      assert.ok(pushes[0].bytes > 0);
    });
  } catch (err) {
    t.diagnostic("push host's stderr, last lines:");
    for (const line of log.slice(-20)) t.diagnostic(line);
    throw err;
  } finally {
    await stopTether(h.proc);
    await new Promise((resolve) => receiver.close(resolve));
  }
});

// A second host runs the ACP test kit's agent (testing/acp/agent.mjs, on
// the official SDK; `npm ci` in testing/acp installs it). Its prompt
// "permission" announces a tool call and asks one permission request with
// the options Allow and Deny, then answers "chose:<option>" ("chose:cancelled"
// when cancelled); "fail" fails the turn. Two clients (two browser
// contexts) show the same chat: the card shows in both, the first answer
// wins and the other client's card says who answered.
test("chat: a permission request shows in two clients; the first answer wins", { timeout: 120000 }, (t) =>
  withACPHost(t, "acp", (acpURL) =>
    withContext(t, (ctxA) =>
      withContext(
        t,
        async (ctxB) => {
          const card = "#chat-log .perm";
          const pending = `${card}[data-state="pending"]`;
          const a = await openChatView(ctxA, acpURL);
          await a.click("#chat-new");
          await prompt(a, "permission");
          await a.waitForSelector(pending, { timeout: wait });
          assert.deepEqual(await a.$$eval(`${pending} .actions button`, (bs) => bs.map((b) => b.textContent)), ["Allow", "Deny", "Cancel"]);
          assert.match(await a.textContent(`${card} .perm-head`), /needs permission/);
          assert.equal(await a.textContent("#chat-log .tool"), "Tool: needs permission — pending");
          await waitRun(a, "working");
          assert.match(await a.textContent("#chat-run"), /waiting for an answer to a permission request/);
          assert.equal(await a.isEnabled("#chat-input"), false, "the prompt box takes a prompt while a run is in flight");
          const key = await a.evaluate(() => window.tether.chat.session().key);

          // The other client opens the chat from its list: the open request
          // comes in the snapshot.
          const b = await openChatView(ctxB, acpURL);
          await b.waitForSelector(`#chat-list li[data-key="${key}"]`, { timeout: wait });
          await b.click(`#chat-list li[data-key="${key}"] .pick`);
          await b.waitForSelector(pending, { timeout: wait });
          const requestID = await a.getAttribute(card, "data-request-id");
          assert.equal(await b.getAttribute(card, "data-request-id"), requestID);

          await b.click(`${pending} button[data-option-id="allow"]`);
          for (const [page, says] of [
            [a, "Allow — answered by another client (admin via ws)"],
            [b, "Allow — answered here"],
          ]) {
            await page.waitForFunction(
              ([sel, says]) => {
                const c = document.querySelector(sel);
                return c.dataset.state === "resolved" && c.querySelector(".perm-outcome").textContent === says;
              },
              [card, says],
              { timeout: wait },
            );
            assert.equal(await page.isVisible(`${card} .actions`), false, "the answered card still offers its options");
            await waitRun(page, "complete");
            assert.deepEqual(await messages(page), [
              ["user", "permission"],
              ["assistant", "chose:allow"],
            ]);
          }

          // Cancel (option_id null), from the first client this time.
          await prompt(a, "permission");
          await b.waitForSelector(pending, { timeout: wait });
          await a.waitForSelector(pending, { timeout: wait });
          await a.click(`${pending} button.cancel`);
          await b.waitForFunction(
            (sel) => [...document.querySelectorAll(sel)].pop().querySelector(".perm-outcome").textContent === "Cancelled — answered by another client (admin via ws)",
            card,
            { timeout: wait },
          );
          for (const page of [a, b]) {
            await waitRun(page, "complete");
            assert.deepEqual((await messages(page)).pop(), ["assistant", "chose:cancelled"]);
            assert.equal(await page.$$eval(pending, (cs) => cs.length), 0);
          }

          // A failed turn says so, with its reason.
          await prompt(b, "fail");
          for (const page of [a, b]) {
            await waitRun(page, "failed");
            assert.match(await page.textContent("#chat-run"), /^failed: \S/);
          }
        },
        "-client2",
      ),
    ),
  ),
);

test("reconnects back off with full jitter", { timeout: 60000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await openChatView(ctx);
    await waitState(page, "connected");
    // The schedule of the terminal's and the chat's sockets: after k failed
    // attempts the delay is r·min(10 s, 0.25 s·2^k) for r uniform in [0, 1).
    const got = await page.evaluate(() => {
      const out = {};
      for (const [name, delay] of [
        ["terminal", window.tether.backoffDelay],
        ["chat", window.tether.chat.backoffDelay],
      ]) {
        const rows = [];
        for (let k = 0; k <= 12; k++) rows.push([0, 0.5, 1 - 2 ** -40].map((r) => delay(k, r)));
        const first = Array.from({ length: 2000 }, () => delay(0, Math.random()));
        const capped = Array.from({ length: 2000 }, () => delay(10, Math.random()));
        const stats = (a) => ({ min: Math.min(...a), max: Math.max(...a), mean: a.reduce((x, y) => x + y, 0) / a.length });
        out[name] = { rows, first: stats(first), capped: stats(capped) };
      }
      return out;
    });
    for (const [name, g] of Object.entries(got)) {
      g.rows.forEach((row, k) => {
        const bound = Math.min(10000, 250 * 2 ** k);
        assert.deepEqual(row, [0, bound / 2, bound - 1], `${name}: the delay after ${k} failed attempts for r = 0, 0.5, 1-2^-40`);
      });
      // Drawn with Math.random, as the page does: spread over the whole
      // window (each bound fails with a chance below 1e-8).
      for (const [what, s, bound] of [
        ["the first retry", g.first, 250],
        ["a capped retry", g.capped, 10000],
      ]) {
        assert.ok(s.min >= 0 && s.min < bound / 100 && s.max < bound && s.max >= bound * 0.99, `${name}, ${what}: ${JSON.stringify(s)}`);
        assert.ok(Math.abs(s.mean - bound / 2) < bound / 20, `${name}, ${what}: mean ${s.mean}, want about ${bound / 2}`);
      }
    }

    // A real drop: the transport restarts (1012 to every socket); the
    // first retry of each socket waits less than 250 ms.
    assert.deepEqual(await page.evaluate(() => [window.tether.retries(), window.tether.chat.retries()]), [[], []]);
    execFileSync(bin, ["plugins", "reload", "ws", "--state-dir", stateDir], { stdio: ["ignore", "ignore", "inherit"] });
    await page.waitForFunction(() => document.body.dataset.chatCloseCode === "1012" && document.body.dataset.closeCode === "1012", null, { timeout: wait });
    await waitChat(page, "connected");
    await waitState(page, "connected");
    const log = await page.evaluate(() => ({ terminal: window.tether.retries(), chat: window.tether.chat.retries() }));
    for (const name of ["terminal", "chat"]) {
      const r = log[name][0];
      assert.ok(r, `${name}: no retry was scheduled`);
      assert.equal(r.attempt, 1, `${name}: the first retry`);
      assert.equal(r.bound, 250);
      assert.ok(r.delay >= 0 && r.delay < 250, `${name}: the first retry waited ${r.delay} ms`);
    }
  }),
);

// Last: it replaces the server. The host is gone for hostGone ms (a
// rebuild takes that long); the page keeps retrying, shows why and when it
// tries next, and is back by itself on the same shell, resuming from its
// cursor.
const hostGone = 30000;
test("the open page reconnects by itself after the host was gone 30 s", { timeout: 180000 }, (t) =>
  withContext(t, async (ctx) => {
    const page = await open(ctx);
    await waitState(page, "connected");
    await waitPrompt(page); // typed before it, the prompt would land inside the line
    await type(page, "echo pid=$$");
    const pid = await waitText(page, String.raw`pid=(\d+)`);
    // The chat's socket too (it stays open in the terminal view).
    await page.click("#view-chat");
    await waitChat(page, "connected");
    await page.click("#view-terminal");

    // Record every state and status line the page shows from now on, with
    // the retry each socket has scheduled then.
    await page.evaluate(() => {
      window.seen = [];
      const note = () =>
        window.seen.push({
          now: Date.now(),
          state: document.body.dataset.state,
          text: document.getElementById("status-text").textContent,
          retry: window.tether.retry(),
          chatText: document.getElementById("chat-status").textContent,
          chatRetry: window.tether.chat.retry(),
        });
      const o = new MutationObserver(note);
      o.observe(document.body, { attributes: true, attributeFilter: ["data-state", "data-chat"] });
      for (const id of ["status-text", "chat-status"]) o.observe(document.getElementById(id), { childList: true, characterData: true, subtree: true });
    });
    const addr = new URL(url).host;
    await stopServer();
    await waitState(page, "reconnecting");
    await page.waitForFunction(() => /^host restarting \(1001\) — reconnecting(?: in \d+ s|…)$/.test(document.getElementById("status-text").textContent), null, {
      timeout: wait,
    });
    await waitDimmed(page);
    const gone = Date.now();
    // The host is away; nothing to wait on but the clock.
    await new Promise((r) => setTimeout(r, hostGone));
    const seen = await page.evaluate(() => window.seen);
    // From the terminal's drop on (the chat's socket may drop first).
    const states = new Set(seen.slice(seen.findIndex((s) => s.state === "reconnecting")).map((s) => s.state));
    assert.deepEqual([...states].filter((s) => s !== "reconnecting"), [], `the page left reconnecting: ${[...states]}`);
    assert.ok(seen.every((s) => !/^connection lost \(1006\)/.test(s.text)), "the page blamed 1006 for the host's 1001");
    // Each retry waited a delay drawn from [0, min(10 s, 0.25 s·2^k)) after
    // k failed attempts, the bound reached the 10 s cap, and every
    // countdown said when the retry it counted down to was due.
    const log = await page.evaluate(() => ({ terminal: window.tether.retries(), chat: window.tether.chat.retries() }));
    for (const [name, textOf, retryOf] of [
      ["terminal", (s) => s.text, (s) => s.retry],
      ["chat", (s) => s.chatText, (s) => s.chatRetry],
    ]) {
      for (const s of seen) {
        const r = retryOf(s);
        const m = /reconnecting in (\d+) s$/.exec(textOf(s));
        if (!m) continue;
        assert.ok(r, `${name}: a countdown with no retry scheduled: ${textOf(s)}`);
        const due = Math.ceil((r.at - s.now) / 1000); // recorded just after the text changed
        assert.ok(Number(m[1]) === due || Number(m[1]) === due + 1, `${name}: "${textOf(s)}" for a retry due in ${r.at - s.now} ms`);
      }
      // The retries of this outage, numbered from 1 (none before it: the
      // page was connected since it opened).
      const list = log[name];
      assert.deepEqual(list.map((r) => r.attempt), list.map((_, i) => i + 1), `${name}: the retries are not numbered 1, 2, …`);
      assert.ok(list.length >= 7, `${name}: only ${list.length} retries in ${hostGone} ms`);
      for (const r of list) {
        assert.equal(r.bound, Math.min(10000, 250 * 2 ** (r.attempt - 1)), `${name}: retry ${r.attempt}'s bound`);
        assert.ok(r.delay >= 0 && r.delay < r.bound, `${name}: retry ${r.attempt} waited ${r.delay} ms, bound ${r.bound}`);
      }
      assert.ok(list.some((r) => r.bound === 10000), `${name}: the bound never reached the 10 s cap: ${JSON.stringify(list)}`);
      t.diagnostic(`${name} waited ${list.map((r) => r.delay).join(", ")} ms`);
    }

    const again = await startServer(["--listen", addr]);
    assert.equal(again.token, token, "the restarted host has another token (token file)");
    url = again.url;
    await waitState(page, "connected"); // the page's own retry, with its cookie
    t.diagnostic(`back ${Date.now() - gone - hostGone} ms after the host`);
    assert.equal((await lastReplay(page)).reason, "resume", "the open page did not resume from its cursor");
    assert.equal(await dimmed(page), false);
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
