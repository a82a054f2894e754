#!/usr/bin/env node
// A tether transport plugin in Node.js, with no Go: the line protocol of
// examples/unixsock (a handshake line "TETHER <query>", then one JSON
// message per line, a close line {"close":CODE,"reason":"..."} last),
// served to the host over go-plugin's gRPC protocol. docs/PLUGINS.md,
// "Writing a plugin in another language", explains each step; README.md
// here says how to run it.

import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

const here = path.dirname(fileURLToPath(import.meta.url));

// go-plugin's handshake (contract.Handshake) and tether's limits.
const MAGIC_COOKIE_KEY = 'TETHER_PLUGIN';
const MAGIC_COOKIE_VALUE = '7f3d1c2a-tether-plugin-v1';
const APP_PROTOCOL_VERSION = 1;
const CORE_PROTOCOL_VERSION = 1; // go-plugin's own
const MAX_MESSAGE_SIZE = 64 << 20; // contract.MaxMessageSize

const VERSION = '0.1.0-node';
const PATH = '/api/ws';
const DEFAULTS = { peerTimeout: 60_000, maxMessage: 1 << 20, sendQueue: 8 << 20 };
const EVENT_BUFFER = 16 << 20; // bytes of events queued for the link before reading pauses
const EVENT_OVERHEAD = 200; // what one event counts besides its payload
const CLOSE_GRACE = 1000; // ms: a close we start, and every close at Stop
const MAX_HANDSHAKE = 8 << 10;

// Close codes (contract/codes.go).
const CLOSE = {
  normal: 1000, goingAway: 1001, protocolError: 1002, unsupported: 1003, noFrame: 1006,
  invalidPayload: 1007, tooBig: 1009, internalError: 1011, tryAgainLater: 1013,
};

// Event and command kinds (transport.proto).
const EVENT = { opened: 1, frame: 2, closed: 3 };
const COMMAND = { admit: 1, send: 2, close: 3 };

// ---- logging: JSON lines on stderr, at the host's level or above ----

const LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'panic'];
const minLevel = (() => {
  const want = process.env.TETHER_PLUGIN_LOG_LEVEL;
  if (want === 'disabled') return LEVELS.length;
  const i = LEVELS.indexOf(want);
  return i < 0 ? 0 : i;
})();

function log(level, message, fields = {}) {
  if (LEVELS.indexOf(level) < minLevel) return;
  process.stderr.write(JSON.stringify({ level, time: new Date().toISOString(), message, ...fields }) + '\n');
}

// ---- errors that keep their class across the boundary (contract/errgrpc.go) ----

// protobuf wire encoding, just enough for google.rpc.Status.
function varint(n) {
  const out = [];
  do {
    let b = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) b |= 0x80;
    out.push(b);
  } while (n > 0);
  return Buffer.from(out);
}
function field(num, wireType, payload) {
  const key = varint(num * 8 + wireType);
  if (wireType === 0) return Buffer.concat([key, varint(payload)]);
  const bytes = Buffer.isBuffer(payload) ? payload : Buffer.from(payload, 'utf8');
  return Buffer.concat([key, varint(bytes.length), bytes]);
}

// tetherError is a gRPC status with an ErrorInfo detail (domain "tether",
// reason one of contract's classes) in grpc-status-details-bin.
function tetherError(code, reason, message) {
  const info = Buffer.concat([field(1, 2, reason), field(2, 2, 'tether')]); // ErrorInfo{reason, domain}
  const any = Buffer.concat([field(1, 2, 'type.googleapis.com/google.rpc.ErrorInfo'), field(2, 2, info)]);
  const status = Buffer.concat([field(1, 0, code), field(2, 2, message), field(3, 2, any)]);
  const metadata = new grpc.Metadata();
  metadata.set('grpc-status-details-bin', status);
  return { code, details: message, metadata };
}
const invalidArgument = (msg) => tetherError(grpc.status.INVALID_ARGUMENT, 'INVALID_ARGUMENT', msg);
const stoppedError = (msg) => tetherError(grpc.status.FAILED_PRECONDITION, 'STOPPED', msg);
const alreadyLinked = () => tetherError(grpc.status.ALREADY_EXISTS, 'ALREADY_LINKED', 'link: transport already linked');

// ---- the transport ----

const state = {
  started: false,
  stopped: false,
  stopping: null, // the promise of the first Stop
  stopDone: false, // the first Stop has ended its link
  server: null, // net.Server
  unixPath: '', // the socket file to remove at Stop
  addr: '',
  cfg: DEFAULTS,
  lastID: 0,
  conns: new Map(), // id -> Conn, from Opened to Closed
  opening: new Set(), // sockets still in their handshake
  open: 0, // sockets accepted and not yet closed (Stats)
  events: [], // queued for the link
  eventBytes: 0,
  paused: new Set(), // Conns whose reading waits for room in the queue
  link: null, // the running Link call
  linkBlocked: false, // the link's stream wants a drain before more
  flushScheduled: false,
  allClosed: null, // resolves when conns and opening are empty (Stop)
};

function push(event) {
  state.events.push(event);
  state.eventBytes += EVENT_OVERHEAD + (event.data ? event.data.length : 0);
  if (!state.flushScheduled) {
    state.flushScheduled = true;
    setImmediate(flush); // what piles up until then goes in one batch
  }
}

// flush writes every queued event to the link as one batch.
function flush() {
  state.flushScheduled = false;
  if (!state.link || state.linkBlocked || state.events.length === 0) return;
  const batch = state.events;
  state.events = [];
  state.eventBytes = 0;
  if (!state.link.write({ events: batch })) {
    state.linkBlocked = true;
    const link = state.link;
    link.once('drain', () => {
      if (state.link !== link) return;
      state.linkBlocked = false;
      flush();
    });
  }
  for (const c of state.paused) c.resumeReading();
  state.paused.clear();
}

function parseListen(listen) {
  if (listen.startsWith('unix:')) return { unix: listen.slice('unix:'.length) };
  if (listen.startsWith('fd:')) {
    const fd = Number(listen.slice(3));
    if (!Number.isInteger(fd) || fd < 3) return null;
    return { fd };
  }
  const m = /^\[?([^\]]*)\]?:(\d+)$/.exec(listen);
  return m ? { host: m[1] || '127.0.0.1', port: Number(m[2]) } : null;
}

// removeStale removes a socket file that nobody answers on.
async function removeStale(file) {
  let st;
  try {
    st = fs.lstatSync(file);
  } catch {
    return;
  }
  if (!st.isSocket()) throw new Error(`${file} exists and is not a socket`);
  const answers = await new Promise((resolve) => {
    const s = net.connect(file, () => { s.destroy(); resolve(true); });
    s.on('error', () => resolve(false));
  });
  if (answers) throw new Error(`${file} is in use by another process`);
  fs.unlinkSync(file);
}

async function start(req) {
  if (state.stopped) throw stoppedError('start: plugin stopped');
  if (state.started) throw invalidArgument('start: already started: invalid argument');
  const where = parseListen(req.listen || '');
  if (!where) throw invalidArgument(`start: listen ${JSON.stringify(req.listen)}: want unix:PATH, fd:N or HOST:PORT: invalid argument`);
  for (const k of ['peer_timeout_ms', 'max_message', 'send_queue']) {
    if (Number(req[k]) < 0) throw invalidArgument('start: negative setting: invalid argument');
  }
  state.started = true;
  state.cfg = {
    peerTimeout: Number(req.peer_timeout_ms) || DEFAULTS.peerTimeout,
    maxMessage: Number(req.max_message) || DEFAULTS.maxMessage,
    sendQueue: Number(req.send_queue) || DEFAULTS.sendQueue,
  };
  const server = net.createServer({ pauseOnConnect: true }, accept);
  try {
    if (where.unix) await removeStale(where.unix);
    await new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(where.unix ? { path: where.unix } : where.fd ? { fd: where.fd } : { host: where.host, port: where.port }, resolve);
    });
  } catch (err) {
    state.started = false;
    throw typeof err.code === 'number' ? err : { code: grpc.status.UNKNOWN, details: `start: ${err.message}` };
  }
  server.on('error', (err) => log('error', 'listener', { error: err.message }));
  if (where.unix) {
    fs.chmodSync(where.unix, 0o600);
    state.unixPath = where.unix;
    state.addr = 'unix:' + where.unix;
  } else {
    const a = server.address();
    state.addr = a.family === 'IPv6' ? `[${a.address}]:${a.port}` : `${a.address}:${a.port}`;
  }
  state.server = server;
  log('info', 'node transport listening', { addr: state.addr, instance: req.instance });
  return { addr: state.addr, version: VERSION, max_connections: 0 };
}

// accept reads a new socket's handshake line within the peer timeout.
function accept(socket) {
  state.open++;
  socket.once('close', () => { state.open--; });
  if (state.stopped) return socket.destroy();
  state.opening.add(socket);
  let buf = Buffer.alloc(0);
  const drop = () => {
    socket.removeListener('data', onData);
    state.opening.delete(socket);
    socket.destroy();
    checkAllClosed();
  };
  const timer = setTimeout(drop, state.cfg.peerTimeout);
  const onData = (chunk) => {
    buf = Buffer.concat([buf, chunk]);
    const nl = buf.indexOf(10);
    if (nl < 0) {
      if (buf.length > MAX_HANDSHAKE) drop();
      return;
    }
    clearTimeout(timer);
    socket.pause();
    socket.removeListener('data', onData);
    state.opening.delete(socket);
    const line = trimCR(buf.subarray(0, nl)).toString('utf8');
    const m = /^TETHER(?: (.*))?$/.exec(line);
    if (!m || state.stopped) {
      if (!m) socket.write(closeLine(CLOSE.protocolError, 'want "TETHER <query>"'), () => socket.destroy());
      else socket.destroy();
      checkAllClosed();
      return;
    }
    const c = new Conn(socket, buf.subarray(nl + 1));
    state.conns.set(c.id, c);
    push({ kind: EVENT.opened, conn: c.id, path: PATH, query: (m[1] || '').trim(), header: [], remote: c.remote, host: state.addr });
    log('debug', 'opened', { conn: c.id, remote: c.remote });
  };
  socket.on('data', onData);
  socket.on('error', () => {}); // 'close' follows
  socket.once('close', () => {
    clearTimeout(timer);
    if (state.opening.delete(socket)) checkAllClosed();
  });
  socket.resume();
}

function trimCR(b) {
  return b.length > 0 && b[b.length - 1] === 13 ? b.subarray(0, b.length - 1) : b;
}

function closeLine(code, reason) {
  return JSON.stringify({ close: code, reason }) + '\n';
}

// parseCloseLine returns {code, reason} for a close line, else null.
function parseCloseLine(line) {
  if (!line.startsWith('{"close":')) return null;
  try {
    const m = JSON.parse(line);
    const keys = Object.keys(m);
    if (!Number.isInteger(m.close) || keys.some((k) => k !== 'close' && k !== 'reason')) return null;
    if (m.reason !== undefined && typeof m.reason !== 'string') return null;
    return { code: m.close, reason: m.reason || '' };
  } catch {
    return null;
  }
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

// Conn is one opened connection: reading starts on admission; what the
// host sends is queued and written in order, then the close line.
class Conn {
  constructor(socket, rest) {
    this.id = ++state.lastID; // never reused
    this.socket = socket;
    this.unix = socket.remoteAddress === undefined;
    this.remote = this.unix ? 'unix' : net.isIPv6(socket.remoteAddress) ? `[${socket.remoteAddress}]:${socket.remotePort}` : `${socket.remoteAddress}:${socket.remotePort}`;
    this.buf = rest; // read, not yet split into lines
    this.admitted = false;
    this.closing = false; // the first close won: no frames, no sends
    this.code = 0;
    this.reason = '';
    this.queue = []; // lines owed to the peer, each with its "\n"
    this.queued = 0; // their bytes
    this.closeAfter = false; // write the close line once the queue is written
    this.admitTimer = setTimeout(() => this.close(CLOSE.tryAgainLater, 'admit timeout', false), state.cfg.peerTimeout);
    this.writeTimer = null; // runs while the socket wants a drain: each write within the peer timeout
    this.graceTimer = null; // bounds a close we started for a limit
    socket.on('data', (chunk) => this.onData(chunk));
    socket.on('end', () => this.lost());
    socket.on('error', () => this.lost());
    socket.on('drain', () => { clearTimeout(this.writeTimer); this.writeTimer = null; this.pump(); });
    socket.once('close', () => this.closed());
  }

  admit() {
    if (this.admitted || this.closing) return;
    this.admitted = true;
    clearTimeout(this.admitTimer);
    this.onData(Buffer.alloc(0)); // what came with the handshake
    if (!this.closing && !state.paused.has(this)) this.socket.resume();
  }

  resumeReading() {
    if (this.closing) return;
    this.onData(Buffer.alloc(0));
    if (!state.paused.has(this)) this.socket.resume();
  }

  onData(chunk) {
    if (this.closing) return; // read and dropped: the host wants no more
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    let nl;
    while (!state.paused.has(this) && (nl = this.buf.indexOf(10)) >= 0) {
      const raw = trimCR(this.buf.subarray(0, nl));
      this.buf = this.buf.subarray(nl + 1);
      if (raw.length > state.cfg.maxMessage) return this.close(CLOSE.tooBig, 'message too big', false);
      let line;
      try {
        line = utf8.decode(raw);
      } catch {
        return this.close(CLOSE.invalidPayload, 'invalid UTF-8', false);
      }
      const peer = parseCloseLine(line);
      if (peer) return this.close(peer.code, peer.reason, false, false);
      push({ kind: EVENT.frame, conn: this.id, binary: false, data: Buffer.from(raw) });
      if (state.eventBytes > EVENT_BUFFER) {
        state.paused.add(this); // reading waits until the link took the queue
        this.socket.pause();
      }
    }
    if (!state.paused.has(this) && this.buf.length > state.cfg.maxMessage + 2) {
      this.close(CLOSE.tooBig, 'message too big', false); // a line that cannot end in time
    }
  }

  send(cmd) {
    if (this.closing) return;
    const data = Buffer.from(cmd.data || []);
    if (cmd.binary || data.includes(10)) {
      log('warn', 'message cannot be sent as one line', { conn: this.id, binary: cmd.binary });
      return this.close(CLOSE.unsupported, 'message cannot be sent as one line', false);
    }
    const line = Buffer.concat([data, Buffer.from('\n')]);
    if (this.queued + this.socket.writableLength + line.length > state.cfg.sendQueue) {
      log('debug', 'send queue full', { conn: this.id });
      return this.close(CLOSE.tryAgainLater, 'send queue full', false);
    }
    this.queue.push(line);
    this.queued += line.length;
    this.pump();
  }

  // close starts closing with code and reason, the first close winning:
  // after the queue when flush, else instead of it; with a close line
  // unless it is the peer's close.
  close(code, reason, flush, writeLine = true) {
    if (this.closing) return;
    this.closing = true;
    this.code = code;
    this.reason = reason;
    clearTimeout(this.admitTimer);
    state.paused.delete(this);
    if (!flush) {
      this.queue = [];
      this.queued = 0;
      this.graceTimer = setTimeout(() => this.socket.destroy(), CLOSE_GRACE);
    }
    this.closeAfter = writeLine;
    this.socket.resume(); // read and drop, so that the peer's close is seen
    if (!writeLine) return this.finish();
    this.pump();
  }

  // pump writes queued lines while the socket takes them, then the close.
  pump() {
    while (this.queue.length > 0 && !this.socket.writableNeedDrain && !this.socket.destroyed) {
      const line = this.queue.shift();
      this.queued -= line.length;
      this.socket.write(line);
    }
    if (this.queue.length === 0 && this.closing && this.closeAfter) {
      this.closeAfter = false;
      this.socket.write(closeLine(this.code, this.reason), () => this.finish());
    }
    if (this.socket.writableNeedDrain && this.writeTimer === null) {
      this.writeTimer = setTimeout(() => { this.lost(); this.socket.destroy(); }, state.cfg.peerTimeout);
    }
  }

  // finish ends the socket: at once on a Unix socket, where nothing sent
  // is lost; on TCP after the peer's end or the close grace.
  finish() {
    if (this.unix) return this.socket.destroy();
    this.socket.end();
    setTimeout(() => this.socket.destroy(), CLOSE_GRACE).unref();
  }

  // lost: the peer went away without a close line (1006).
  lost() {
    if (!this.closing) this.close(CLOSE.noFrame, '', false, false);
    else this.socket.destroy();
  }

  closed() {
    clearTimeout(this.admitTimer);
    clearTimeout(this.writeTimer);
    clearTimeout(this.graceTimer);
    state.paused.delete(this);
    state.conns.delete(this.id);
    const code = this.code || CLOSE.noFrame;
    push({ kind: EVENT.closed, conn: this.id, code, reason: this.reason });
    log('debug', 'closed', { conn: this.id, code, reason: this.reason });
    checkAllClosed();
  }
}

function exec(cmds) {
  for (const cmd of cmds) {
    const c = state.conns.get(Number(cmd.conn));
    if (!c) continue; // gone: ignored
    switch (cmd.kind) {
      case COMMAND.admit:
        c.admit();
        break;
      case COMMAND.send:
        c.send(cmd);
        break;
      case COMMAND.close:
        c.close(cmd.code || CLOSE.normal, cmd.reason, true);
        break;
      default:
        log('warn', 'unknown command ignored', { conn: c.id, kind: cmd.kind });
    }
  }
}

function checkAllClosed() {
  if (state.allClosed && state.conns.size === 0 && state.opening.size === 0) state.allClosed();
}

// stop closes the listener, then every connection with code after what
// is queued; it resolves once every Closed is written to the link and
// the link has ended.
function stop(code, reason) {
  if (state.stopping) return state.stopping;
  state.stopped = true;
  state.stopping = (async () => {
    const conns = [...state.conns.values()];
    const closedAll = new Promise((resolve) => { state.allClosed = resolve; });
    if (state.server) {
      state.server.close(); // stops accepting now; its callback waits for every socket
      if (state.unixPath) fs.rmSync(state.unixPath, { force: true });
    }
    for (const s of state.opening) s.destroy();
    for (const c of conns) {
      c.close(code || CLOSE.goingAway, reason, true);
      setTimeout(() => c.socket.destroy(), CLOSE_GRACE).unref();
    }
    checkAllClosed();
    await closedAll;
    await new Promise((resolve) => setImmediate(resolve)); // the last Closed is queued
    flush();
    if (state.link) {
      const link = state.link;
      state.link = null;
      link.end(); // the host's Link returns nil
    }
    state.stopDone = true;
    log('info', 'node transport stopped', { conns: conns.length });
  })();
  return state.stopping;
}

// link runs the Link stream: commands in, event batches out.
function link(call) {
  if (state.link) return call.emit('error', alreadyLinked());
  state.link = call;
  state.linkBlocked = false;
  call.on('data', (batch) => exec(batch.commands || []));
  const done = () => {
    if (state.link === call) state.link = null;
  };
  call.on('end', () => { done(); call.end(); });
  call.on('cancelled', done);
  call.on('error', done);
  if (state.stopDone) {
    // Stopped already: deliver what is left, then end.
    flush();
    state.link = null;
    call.end();
    return;
  }
  flush();
}

// ---- go-plugin ----

// transportProto is contract/proto/tetherv1/transport.proto: beside this
// file when it was copied out of the repository, else the repository's.
function transportProto() {
  const beside = path.join(here, 'transport.proto');
  return fs.existsSync(beside) ? beside : path.join(here, '..', '..', 'contract', 'proto', 'tetherv1', 'transport.proto');
}

function loadProto(file) {
  return grpc.loadPackageDefinition(protoLoader.loadSync(file, { keepCase: true, longs: Number, enums: Number, defaults: true }));
}

function unary(fn) {
  return (call, callback) => {
    Promise.resolve()
      .then(() => fn(call.request))
      .then((res) => callback(null, res), (err) => callback(typeof err.code === 'number' ? err : { code: grpc.status.UNKNOWN, details: String(err.message || err) }));
  };
}

function main() {
  if (process.env[MAGIC_COOKIE_KEY] !== MAGIC_COOKIE_VALUE) {
    process.stderr.write('This binary is a plugin. These are not meant to be executed directly.\n' +
      'Please execute the program that consumes these plugins, which will\nload any plugins automatically\n');
    process.exit(1);
  }
  const versions = (process.env.PLUGIN_PROTOCOL_VERSIONS || String(APP_PROTOCOL_VERSION)).split(',').map(Number);
  if (!versions.includes(APP_PROTOCOL_VERSION)) {
    log('error', 'the host speaks none of our protocol versions', { host: versions, ours: APP_PROTOCOL_VERSION });
  }

  const tether = loadProto(transportProto()).tether.v1;
  const health = loadProto(path.join(here, 'proto', 'health.proto')).grpc.health.v1;
  const controller = loadProto(path.join(here, 'proto', 'controller.proto')).plugin;

  const server = new grpc.Server({
    'grpc.max_receive_message_length': MAX_MESSAGE_SIZE,
    'grpc.max_send_message_length': MAX_MESSAGE_SIZE,
  });
  server.addService(tether.Transport.service, {
    Start: unary(start),
    Link: link,
    Stop: unary(async (req) => { await stop(req.code, req.reason); return {}; }),
    Stats: unary(() => ({ connections: state.open, refused: 0 })),
  });
  server.addService(health.Health.service, {
    Check: (call, callback) => {
      if (call.request.service === '' || call.request.service === 'plugin') callback(null, { status: 1 }); // SERVING
      else callback({ code: grpc.status.NOT_FOUND, details: 'unknown service' });
    },
  });
  let sock = '';
  const exit = () => {
    server.forceShutdown();
    for (const f of [sock, state.unixPath]) if (f) fs.rmSync(f, { force: true });
    process.exit(0);
  };
  server.addService(controller.GRPCController.service, {
    Shutdown: (call, callback) => {
      callback(null, {});
      server.tryShutdown(exit); // once the calls in flight, this one included, are done
      setTimeout(exit, CLOSE_GRACE).unref(); // a link left open does not hold the exit
    },
  });

  // The socket goes where the host says (PLUGIN_UNIX_SOCKET_DIR: tether's
  // state dir), under a fresh name.
  const dir = process.env.PLUGIN_UNIX_SOCKET_DIR || os.tmpdir();
  sock = path.join(dir, 'plugin' + crypto.randomBytes(6).toString('hex'));
  server.bindAsync('unix://' + sock, grpc.ServerCredentials.createInsecure(), (err) => {
    if (err) {
      log('error', 'plugin init error', { error: err.message });
      process.exit(1);
    }
    // The one line stdout carries: CORE|APP|NETWORK|ADDR|PROTOCOL.
    process.stdout.write(`${CORE_PROTOCOL_VERSION}|${APP_PROTOCOL_VERSION}|unix|${sock}|grpc\n`);
  });

  // Like a Go plugin: Ctrl-C in the host's terminal is the host's to
  // handle; the host ends us through Shutdown.
  process.on('SIGINT', () => {});
  process.on('SIGTERM', exit);
  // A transport must not outlive its host (it would keep its socket).
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) {
      log('warn', 'host is gone; transport plugin exiting', { host_pid: parent });
      exit();
    }
  }, 500).unref();
}

main();
