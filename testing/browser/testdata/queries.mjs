// A program that asks its terminal what programs like vim ask on start,
// then echoes typed lines. Run in a PTY by browser.test.mjs.
//
// On start, and again on the line "again", it writes the queries DA1,
// CPR, OSC 10 and OSC 11 (colour queries), DECRQM (bracketed paste) and
// last DSR 5, reads the terminal's answers up to the answer to DSR 5
// (terminals answer in order, so every earlier answer is in by then),
// and prints READY<n>. Every other line it reads is printed back as
// GOT:<line>, with control characters escaped, so any stray answer that
// reaches its input shows. "quit" ends it.

const QUERIES = "\x1b[c" + "\x1b[6n" + "\x1b]10;?\x1b\\" + "\x1b]11;?\x1b\\" + "\x1b[?2004$p" + "\x1b[5n";
const SENTINEL = "\x1b[0n"; // the answer to DSR 5, "terminal OK"

let asked = 0;
let waiting = false;
let buf = "";

function ask() {
  asked++;
  waiting = true;
  process.stdout.write(QUERIES);
}

function visible(s) {
  return s.replace(/[\x00-\x1f\x7f]/g, (c) => "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0"));
}

process.stdin.setRawMode(true);
process.stdin.on("data", (d) => {
  buf += d.toString("latin1");
  for (;;) {
    if (waiting) {
      const i = buf.indexOf(SENTINEL);
      if (i < 0) return;
      buf = buf.slice(i + SENTINEL.length);
      waiting = false;
      process.stdout.write("READY" + asked + "\r\n");
      continue;
    }
    const j = buf.indexOf("\r");
    if (j < 0) return;
    const line = buf.slice(0, j);
    buf = buf.slice(j + 1);
    if (line === "quit") process.exit(0);
    if (line === "again") ask();
    else process.stdout.write("GOT:" + visible(line) + "\r\n");
  }
});
ask();
