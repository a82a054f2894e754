// Package pty is tether's PTY keep-alive backend (SPEC §6): a registry of
// PTYs keyed by attach token, each drained into a ring buffer with
// absolute offsets, with one writer and any number of read-only viewers,
// a TTL for detached PTYs and a cap on live ones. It implements
// contract.Backend; a plugin binary's main is
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
// [offset, end) ("resume"); otherwise it replays the whole window with
// Reset set and the reason why. ReplayEnd is end at the moment of the
// attach, taken under the PTY's lock that the drain appends under, so
// every byte at or past ReplayEnd reaches the Output stream after the
// attach: a host that buffers a viewer's live output from the moment it
// calls Attach and drops what lies before ReplayEnd sends each byte once.
//
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
// is switched to non-blocking mode) and one exit waiter (blocked in
// waitid(2), so it holds an OS thread). Per backend: the reaper and,
// while Output runs, the caller's goroutine. Shutdown kills every PTY and
// waits for all of them.
//
// # Locking
//
// Lock order: Backend.mu (registry, configuration, stream registration)
// before ptyRec.mu (ring, writer, viewers, detach time, exit state, the
// stream's cursor). The drain takes only ptyRec.mu, and waits for room on
// ptyRec.room, a condition on it that the stream broadcasts after each
// batch its sink took and when it ends. No lock is held across a read or write of a
// master, a wait for a child, a channel send that can block or a call to
// the sink; kill sends its signal under ptyRec.mu so that finish cannot
// reap the child in between.
package pty
