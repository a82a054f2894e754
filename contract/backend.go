package contract

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"
)

// Backend errors (they cross the gRPC boundary like the others).
var (
	// ErrRegistryFull: every PTY is attached and the cap is reached.
	ErrRegistryFull = errors.New("registry full")
	// ErrExited: the PTY's process has exited.
	ErrExited = errors.New("pty process exited")
	// ErrNoSuchTerminal: a view attach named a token that has no live
	// PTY (a view never spawns one; the host closes it with 4411).
	ErrNoSuchTerminal = errors.New("no such terminal")
)

// BackendConfig configures a PTY backend before use.
type BackendConfig struct {
	// Argv is the command run in each new PTY.
	Argv []string
	// TTL is how long a detached PTY lives (--pty-ttl;
	// docs/PROTOCOL.md §13.6).
	TTL time.Duration
	// MaxSessions caps the live PTYs (--pty-max-sessions;
	// docs/PROTOCOL.md §13.6).
	MaxSessions int
	// Buffer is the replay ring size per PTY in bytes (--pty-buffer).
	Buffer int64
	// Scrollback is how many lines scrolled off the screen each PTY's
	// screen model keeps and a snapshot sends (--pty-scrollback; 0 takes
	// the backend's default, NoScrollback keeps none).
	Scrollback int
	// Instance is the plugin instance id the host assigned (for logs).
	Instance string
	// Challenge is a random nonce: a backend started with an instance
	// secret (EnvPluginSecret) answers it with Proof, so that a host
	// reattaching to a process it did not start can tell it is the
	// plugin its record names.
	Challenge string
	// IdleExit is how long the backend lives on once no host is linked
	// (no Output stream) and no PTY is left (0: the backend's default).
	IdleExit time.Duration
	// MaxCols and MaxRows are the largest PTY size a Resize or a new
	// PTY may ask for (--pty-max-size; 0 takes the backend's default): a
	// larger one fails with ErrInvalidArgument. The host drops a larger
	// resize before it reaches the backend; the backend holds the bound
	// too, for a host that does not.
	MaxCols, MaxRows int
}

// BackendInfo describes a started backend.
type BackendInfo struct {
	Version string
	Pid     int
	// Proof is Prove(secret, Challenge), or "" without a secret.
	Proof string
}

// EnvPluginSecret names the environment variable through which the host
// gives a PTY backend process its instance secret at its start. The
// process reads it, removes it from its environment, and proves it with
// Prove on every Start.
const EnvPluginSecret = "TETHER_PLUGIN_SECRET"

// EnvPluginLogLevel names the environment variable through which the
// host tells every plugin it starts the least level it logs: "trace",
// "debug", "info", "warn", "error" or "disabled" (zerolog's names). The host
// re-emits a plugin's JSON stderr lines at their level and drops those
// below its own, after parsing each: a plugin that skips them instead
// saves both processes the work. Missing, it means every level.
const EnvPluginLogLevel = "TETHER_PLUGIN_LOG_LEVEL"

// EnvPluginUmask names the environment variable through which the host
// tells a PTY backend process, at its start, the umask (octal, "0022")
// of the user who started the host. The host itself runs with umask 077
// so that its files are private, and so does the plugin it starts; the
// processes the backend runs for the user (each PTY's shell) must get
// this one. The process reads it and removes it from its environment.
// Missing, the shells inherit the plugin's own umask.
const EnvPluginUmask = "TETHER_PLUGIN_UMASK"

// Prove is the proof of a secret for a challenge: hex HMAC-SHA256.
func Prove(secret, challenge string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(challenge))
	return hex.EncodeToString(m.Sum(nil))
}

// AttachRequest attaches a viewer to the PTY of Token, spawning it when
// there is none (a view attach never spawns: ErrNoSuchTerminal).
type AttachRequest struct {
	// Token is the attach token (docs/PROTOCOL.md §13.1: 16–128 of
	// [A-Za-z0-9_-]).
	Token string
	// Viewer is the attaching socket's transport identity.
	Viewer TransportID
	// View attaches read-only: it never writes, resizes or supersedes.
	View bool
	// HasCursor says Offset and Epoch were given by the client.
	HasCursor bool
	Offset    int64
	Epoch     string
	// Cols and Rows are the attaching writer's terminal size (0: none).
	// A newly spawned PTY starts at it (0 = 80x24); a live PTY a writer
	// (not a view) attaches to takes it, both being set, before the
	// replay is decided, so that a snapshot is of the screen at this
	// size; the program's redraw for it is live output after ReplayEnd.
	// A size over BackendConfig.MaxCols×MaxRows fails with
	// ErrInvalidArgument (the host sends none).
	Cols, Rows int
	// Argv overrides the configured command for a new PTY (nil = default).
	Argv []string

	// OnHeader and OnReplay, when both set, ask for the replay as it
	// comes instead of in one piece. A backend that streams it (the gRPC
	// client does) calls OnHeader once, with the response and an empty
	// Replay, as soon as the cursor is decided, then OnReplay with each
	// piece of the replay in order, all before Attach returns, and returns
	// the response with an empty Replay. A backend that does not calls
	// neither and returns the whole Replay. The pieces are the caller's
	// to keep. Neither crosses the process boundary.
	OnHeader func(AttachResponse)
	OnReplay func(piece []byte)
}

// AttachResponse is what the host needs to send pty.replay and the replay.
//
// A reset attach (Reset true: a reason other than resume) is answered
// with a snapshot (Snapshot true): Replay is an escape-sequence stream
// that, written to a fresh terminal of Cols×Rows, reproduces the screen
// model at ReplayEnd — scrollback, screen, alternate screen, cursor,
// modes, title — and holds no sequence a terminal answers; StartOffset
// equals ReplayEnd. An attach that resumes gets the raw bytes.
type AttachResponse struct {
	Epoch       string
	StartOffset int64
	// ReplayEnd is the offset where the replay stops; live output to this
	// viewer starts at it.
	ReplayEnd int64
	Reset     bool
	Reason    string // a wire.Reason* replay reason
	// Replay holds the bytes [ReplayEnd-len(Replay), ReplayEnd), or the
	// snapshot.
	Replay []byte
	// Snapshot says Replay is a snapshot of the screen at ReplayEnd, not
	// raw output.
	Snapshot bool
	// SnapshotBytes is the snapshot's length, also when the replay is
	// streamed (OnHeader sees it before the bytes).
	SnapshotBytes int64
	// Cols and Rows are the snapshot's terminal size.
	Cols, Rows int
	// Superseded is the previous writer, which the host closes with 4409
	// (zero when there was none or the attach is a view).
	Superseded TransportID
	// Spawned reports that the PTY was created by this attach.
	Spawned bool
	Pid     int
}

// PTYInfo describes one PTY (for List).
type PTYInfo struct {
	Token       string
	Epoch       string
	Pid         int
	StartOffset int64
	EndOffset   int64
	Writer      TransportID // zero when detached
	Viewers     int         // read-only viewers
	Exited      bool
	Created     time.Time
	Detached    time.Time // zero while a writer is attached
	// Cols and Rows are the terminal's size.
	Cols, Rows int
	// ScreenRebuilds counts the times the PTY's screen model fell
	// further behind its output than the ring holds and was rebuilt from
	// the ring (losing what came before).
	ScreenRebuilds int64
}

// Output is a piece of one PTY's output stream, or its end.
type Output struct {
	Token string
	// Offset is the absolute offset of Data[0].
	Offset int64
	Data   []byte
	// Exited marks the end: every byte has been sent before it, and the
	// PTY record is gone after it.
	Exited   bool
	ExitCode int
	// Epoch identifies the PTY instance the output belongs to.
	Epoch string
}

// OutputSink receives batches of output, in order per PTY. It must not
// retain the slice after returning.
type OutputSink func(ctx context.Context, out []Output) error

// Backend is what a PTY backend plugin implements: the PTYs behind
// /api/pty (docs/PROTOCOL.md §13).
type Backend interface {
	// Start configures the backend. It is called once per host link; a
	// backend that outlives a host keeps its PTYs and applies the new
	// configuration to new PTYs.
	Start(ctx context.Context, cfg BackendConfig) (BackendInfo, error)
	// Attach attaches req.Viewer to the PTY of req.Token, spawning it if
	// needed; a non-view attach makes the viewer the one writer. It
	// returns ErrRegistryFull when the cap is reached and no detached PTY
	// can be evicted.
	Attach(ctx context.Context, req AttachRequest) (AttachResponse, error)
	// Detach removes viewer from the PTY of token. For the writer it is a
	// compare-and-swap: it does nothing (ErrStaleTransport) when viewer is
	// no longer the current writer.
	Detach(ctx context.Context, token string, viewer TransportID) error
	// Write writes data to the PTY if viewer is its current writer, else
	// drops it and returns ErrStaleTransport.
	Write(ctx context.Context, token string, viewer TransportID, data []byte) error
	// Resize resizes the PTY if viewer is its current writer.
	Resize(ctx context.Context, token string, viewer TransportID, cols, rows int) error
	// Close kills the PTY's process group and removes it.
	Close(ctx context.Context, token string) error
	// List describes every PTY.
	List(ctx context.Context) ([]PTYInfo, error)
	// Output streams every PTY's output to sink until ctx is done, in
	// offset order per PTY and contiguous while the stream keeps up. A
	// stream too slow for a PTY's ring skips ahead: the next Output of
	// that PTY then starts past the last one's end, and the host drops
	// the sockets that missed bytes (they reattach with their offset).
	// Only one Output stream runs at a time (ErrAlreadyLinked); a new
	// stream starts at each PTY's current end offset.
	Output(ctx context.Context, sink OutputSink) error
}

// ScreenRebuildCounter is implemented by a Backend that counts the
// rebuilds of its PTYs' screen models over its lifetime, PTYs gone since
// included (PTYInfo.ScreenRebuilds counts one live PTY's). It is
// optional: for a backend without it, the gRPC server reports the sum
// over the live PTYs.
type ScreenRebuildCounter interface {
	// ScreenRebuilds returns the count, which never decreases.
	ScreenRebuilds(ctx context.Context) (int64, error)
}

// NoScrollback as BackendConfig.Scrollback keeps no scrollback.
const NoScrollback = -1
