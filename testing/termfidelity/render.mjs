// Renders jobs in @xterm/headless, the terminal of the page, for the
// snapshot fidelity test: each stdin line is a JSON job {cols, rows,
// scrollback, ops: [{write: base64} | {resize: [cols, rows]}]}; each
// stdout line the JSON dump of the terminal after it (see fidelity_test.go).
import readline from 'node:readline';
import pkg from '@xterm/headless';
const { Terminal } = pkg;

function color(cell, fg) {
  if (fg ? cell.isFgDefault() : cell.isBgDefault()) return 'd';
  const v = fg ? cell.getFgColor() : cell.getBgColor();
  if (fg ? cell.isFgRGB() : cell.isBgRGB()) return '#' + v.toString(16).padStart(6, '0');
  return 'p' + v;
}

function flags(c) {
  let s = '';
  if (c.isBold()) s += 'b';
  if (c.isDim()) s += 'f';
  if (c.isItalic()) s += 'i';
  if (c.isUnderline()) s += 'u';
  if (c.isBlink()) s += 'k';
  if (c.isInverse()) s += 'r';
  if (c.isInvisible()) s += 'h';
  if (c.isStrikethrough()) s += 's';
  return s;
}

function dumpBuffer(buf, cols) {
  const lines = [];
  const cell = buf.getNullCell();
  for (let y = 0; y < buf.length; y++) {
    const line = buf.getLine(y);
    const cells = [];
    for (let x = 0; x < cols; x++) {
      line.getCell(x, cell);
      const w = cell.getWidth();
      if (w === 0) continue; // the second half of a wide character
      cells.push([cell.getChars() || ' ', w, color(cell, true), color(cell, false), flags(cell)]);
    }
    // Trailing blanks with default attributes are not content.
    while (cells.length && cells[cells.length - 1][0] === ' ' && cells[cells.length - 1][2] === 'd' &&
           cells[cells.length - 1][3] === 'd' && cells[cells.length - 1][4] === '') cells.pop();
    lines.push({ wrapped: line.isWrapped, cells });
  }
  return lines;
}

function write(term, data) {
  return new Promise((resolve) => term.write(data, resolve));
}

async function render(job) {
  const term = new Terminal({ cols: job.cols, rows: job.rows, scrollback: job.scrollback ?? 1000, allowProposedApi: true });
  let title = '';
  term.onTitleChange((t) => { title = t; });
  const answers = [];
  term.onData((d) => answers.push(d));
  for (const op of job.ops) {
    if (op.write !== undefined) await write(term, Buffer.from(op.write, 'base64'));
    if (op.resize) term.resize(op.resize[0], op.resize[1]);
  }
  const core = term._core;
  const active = term.buffer.active;
  const out = {
    cols: term.cols, rows: term.rows,
    active: active.type,
    cursor: { x: active.cursorX, y: active.cursorY, hidden: core.coreService.isCursorHidden },
    title,
    modes: term.modes,
    mouseEncoding: core.coreMouseService.activeEncoding,
    answers: answers.join(''),
    normal: dumpBuffer(term.buffer.normal, term.cols),
    normalBaseY: term.buffer.normal.baseY,
    alternate: active.type === 'alternate' ? dumpBuffer(term.buffer.alternate, term.cols) : null,
  };
  term.dispose();
  return out;
}

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) {
  if (!line.trim()) continue;
  process.stdout.write(JSON.stringify(await render(JSON.parse(line))) + '\n');
}
