// Package pty is tether's PTY keep-alive backend (docs/PROTOCOL.md §13):
// a registry of PTYs keyed by attach token, each drained into a ring
// buffer with absolute offsets, with one writer and any number of
// read-only viewers, a TTL for detached PTYs and a cap on live ones. It
// implements contract.Backend; a plugin binary's main is
//
//	contract.ServeBackend(pty.New(logger))
//
// # Tokens
//
// An attach token is 16–128 characters of [A-Za-z0-9_-], or "legacy-"
// followed by at least 8 hex digits: the host names the PTY of a legacy
// one-PTY-per-socket connection so and Closes it when the socket closes.
//
// # PTYs
//
// The first Attach of a token spawns the PTY: the configured command (or
// the attach's Argv) on a new terminal of the attach's size (default
// 80x24), in its own session and process group, with the plugin's
// environment and TERM=xterm-256color. Each spawned PTY gets a fresh random
// epoch. The spawn runs outside the registry lock; concurrent attaches of
// the same new token wait for it and attach to the one PTY.
//
// Every byte the PTY outputs has an absolute offset from its start; the
// ring keeps the last BackendConfig.Buffer bytes, [start, end). An attach
// with a cursor (epoch, offset) that lies in the window replays
// [offset, end) ("resume"), with ReplayEnd the end at the moment of the
// attach, taken under the PTY's lock that the drain appends under, so
// every byte at or past ReplayEnd reaches the Output stream after the
// attach: a host that buffers a viewer's live output from the moment it
// calls Attach and drops what lies before ReplayEnd sends each byte once.
// Any other attach is Reset, with the reason why, and gets a snapshot of
// the screen model instead (below): StartOffset = ReplayEnd = the model's
// offset, at or past that end, so the same host logic holds.
//
// # Screen model
//
// Each PTY has a terminal emulator, github.com/charmbracelet/x/vt, fed
// with its output by a feeder goroutine off the drain's path: the drain
// appends to the ring and wakes the feeder, which copies from the ring
// what the model has not seen (16 KiB at a time) and feeds it, taking at
// most a fifth of a CPU, so the model may lag. A snapshot catches it up
// with the ring's end first. A model that fell further behind than the
// ring's start (a flood of output) stops until the output pauses for
// 500 ms or a snapshot asks, and is then rebuilt from the ring's tail — the
// last lines enough for a screen and its scrollback, at most 256 KiB —
// which loses what came before (modes, the alternate screen) and counts in
// PTYInfo.ScreenRebuilds. A snapshot never feeds more than that tail
// either: it rebuilds instead. Terminal sizes are recorded at the ring
// offset of each Resize, so the model resizes where the output did.
// Once the model has caught up and the output pauses for 50 ms, the
// feeder renders the snapshot ahead (taking at most 2 % of a CPU for
// it); a snapshot is kept with the emulator and the count of its changes
// it was rendered from, and served as is while neither moved, so an
// attach to a PTY whose output paused renders nothing.
//
// The snapshot (snapshot.go) is text with SGR colours and attributes and
// hyperlinks, line by line: the scrollback (up to BackendConfig.Scrollback
// lines, default 1000), the primary screen, and when it is shown the
// alternate screen after ?1049h; then the scroll region, the input modes
// (DECCKM, DECKPAM, autowrap, insert, newline, mouse reporting 9, 1000,
// 1002, 1003 with encodings 1005, 1006, 1015, focus events 1004,
// bracketed paste 2004), the title (control characters removed), the
// cursor's style, pen, visibility and position. It holds no query.
//
// Why x/vt, with figures against xterm.js, and what it gets wrong (and the
// glue in vt.go fixes): docs/TERMINAL.md. In short: of the Go emulators on
// the module proxy only x/vt keeps scrollback, wide characters, 24-bit
// colour and the input modes. Against xterm.js it matched 12 of 23
// evaluation streams cell for cell as it comes and 16 with the glue, and
// every stream of the fidelity test (testing/termfidelity);
// hinshun/vt10x matched 14, having no scrollback at all, no wide
// characters, and bold turning colours bright. x/vt is slow — 1.8 MB/s of
// scrolling coloured lines at 80x24, 0.5 MB/s at 200x60, 7 MB/s of
// full-screen redraws (vt10x: 6-8 MB/s) — hence the feeder's lag and
// rebuilds; PTY throughput with the model on stays at 0.94x or more of the
// model off.
// # Writer and viewers
//
// A non-view attach makes its viewer the one writer and returns the
// previous one as Superseded. Write and Resize from anyone but the writer
// fail with contract.ErrStaleTransport and change nothing, and so does a
// Detach from anyone but the writer or a read-only viewer (a superseded
// writer's late detach). A view attach never supersedes; a view attach
// by the current writer turns it into a read-only viewer.
//
// # Lifetime
//
// A PTY counts as detached while it has no writer, read-only viewers or
// not: watching does not keep a PTY alive. One reaper goroutine kills
// (SIGKILL to the process group) and removes PTYs detached for longer than
// the TTL, sleeping until the earliest deadline. At MaxSessions live PTYs
// a new token evicts the PTY detached the longest, else Attach fails with
// contract.ErrRegistryFull. Close, the reaper and eviction remove the PTY
// from the registry at once (a new attach of its token spawns a new PTY)
// and kill its process group; it then ends like an exiting one.
//
// When the child exits, the drain reads the terminal until it closes
// (EIO); if something else keeps it open, it reads for exitGrace more and
// takes what the kernel still holds. The backend then kills what is left
// of the process group, reaps the child (exit code, or 128+signal), closes
// the master and removes the PTY from the registry; the Output stream
// sends its remaining bytes and then an exit marker. The child is reaped
// only after its group has been killed, so a kill never hits a reused pid.
//
// # Output
//
// One Output stream runs at a time. A single sender keeps a cursor per
// PTY and sends everything pending in one batch, so output is batched
// while the sink is busy; under load it also holds a small batch for up
// to a millisecond (coalesceWait) so that messages carry tens of KiB.
// While a stream runs, the drain never reads more than the ring can take
// without overwriting bytes the stream has not sent: it waits for the
// stream's cursor (ptyRec.room), the terminal's buffer fills and the
// kernel blocks the child, so the child runs at the pace of the sink and
// no byte is skipped. With no stream the drain runs free and the ring
// keeps the latest output; a cursor that is out of the ring (it cannot
// happen while linked) skips to the ring's start and the host sees the
// gap. PTYs that end while no stream runs drop their ring and keep only
// their exit marker for the next stream.
//
// # Goroutines and cost
//
// Per PTY: one drain goroutine (parked in the runtime poller: the master
// is switched to non-blocking mode), one exit waiter (blocked in
// waitid(2), so it holds an OS thread) and the screen model's feeder. The
// model costs memory: up to Scrollback lines of cells (about 110 bytes a
// cell: 9 MB for 1,000 full lines of 80 columns, less for real output,
// whose lines are stored trimmed). Per backend: the reaper and,
// while Output runs, the caller's goroutine. Shutdown kills every PTY and
// waits for all of them.
//
// # Locking
//
// Lock order: Backend.mu (registry, configuration, stream registration)
// before ptyRec.mu (ring, writer, viewers, detach time, exit state, the
// stream's cursor, the size log); screen.mu (the emulator) before
// ptyRec.mu and never under Backend.mu — the feeder and a snapshot hold it
// while they emulate, taking ptyRec.mu only to copy from the ring. The drain takes only ptyRec.mu, and waits for room on
// ptyRec.room, a condition on it that the stream broadcasts after each
// batch its sink took and when it ends. No lock is held across a read or write of a
// master, a wait for a child, a channel send that can block or a call to
// the sink; kill sends its signal under ptyRec.mu so that finish cannot
// reap the child in between.
package pty
