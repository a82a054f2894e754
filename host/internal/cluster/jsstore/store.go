package jsstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/host/internal/cluster/bus"
	"github.com/tether-agent/tether/host/store"
)

// Config configures the JetStream objects a Store keeps its data
// in, created when they do not exist yet; existing ones are used as they
// are.
type Config struct {
	// Prefix names them: bucket <Prefix>_store, streams <PREFIX>_EVENTS
	// and <PREFIX>_MESSAGES on subjects <Prefix>.journal.<key> and
	// <Prefix>.messages.<key> (default "tether"). Letters, digits, '_'
	// and '-' only.
	Prefix string
	// Replicas is how many servers keep each of them (default 1): 3 on a
	// three-server cluster.
	Replicas int
	// Storage is jetstream.FileStorage (the zero value) or MemoryStorage.
	Storage jetstream.StorageType
}

// Headers of the stream messages.
const (
	// hdrSeq is the session seq of a journal message, and the index
	// (from 1) of the first display row of a messages message.
	hdrSeq = "Tether-Seq"
	// hdrCount is how many display rows a messages message holds.
	hdrCount = "Tether-Count"
	// hdrPart is the index (from 1) of a messages message among its
	// subject's.
	hdrPart = "Tether-Part"
	// hdrBatch is, on a messages message a Commit wrote, the lowest seq
	// of the session's events in that Commit.
	hdrBatch = "Tether-Batch"
	// hdrBefore is, on a journal message, the bytes of the session's
	// events journaled before it (their params), from its first event
	// on, pruned ones included: a journal's bytes are its last event's
	// hdrBefore and size less its first's hdrBefore. Missing (a message
	// of a tether before the bytes bound) it is 0.
	hdrBefore = "Tether-Bytes-Before"
)

// Store is host/store's *Store on JetStream: the same methods, errors
// and ordering, for any host of a cluster. See the package doc for the
// layout. Its methods are safe for concurrent use. It does not own the
// connection: close that after Close.
type Store struct {
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	rows     jetstream.Stream // the bucket's stream, direct gets off
	rowsSubj string           // the rows' subjects in it, "$KV.<bucket>.s.*"
	events   jetstream.Stream
	messages jetstream.Stream
	evName   string // the events stream's name
	evSubj   string // the journal subjects' prefix, "<prefix>.journal."
	msgSubj  string // the messages subjects' prefix, "<prefix>.messages."

	fault   atomic.Pointer[func() error]
	onFault atomic.Pointer[func(error)]
	closed  atomic.Bool
	retries atomic.Uint64 // writes asked again while busy

	// keyLocks serialises this process's writers of one session's
	// messages subject, so that a writer that lost a race to another of
	// this process does not spin; the expected-last-subject-sequence
	// check still decides between hosts.
	keyLocks sync.Map // key → *sync.Mutex

	// tops caches the last event this process journaled or read per
	// session, saving a read before each append. A stale entry (another
	// host journaled since) costs one refused publish and a read: the
	// server's expected-last-subject-sequence check decides, never it.
	tops sync.Map // key → journalTop

	// floors caches, per session, hdrBefore of its first event as this
	// process last read it: it only grows (a prune raises it), so the
	// last event's end less it is at least the journal's bytes, and a
	// journal under its bytes bound by that much is not read.
	floors sync.Map // key → uint64
}

var _ interface {
	Close() error
	QuickCheck(context.Context) error
} = (*Store)(nil)

// Open opens (creating them if needed) the bucket and streams of
// cfg on js.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "tether"
	}
	if !bus.ValidToken(cfg.Prefix) {
		return nil, fmt.Errorf("open store: prefix %q: %w", cfg.Prefix, store.ErrInvalid)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	kv, err := bus.OpenLeaderKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      cfg.Prefix + "_store",
		Description: "tether stored sessions: one row per session",
		History:     1,
		Replicas:    cfg.Replicas,
		Storage:     cfg.Storage,
	})
	if err != nil {
		return nil, fmt.Errorf("open store: %v: %w", err, store.ErrUnavailable)
	}
	// The bucket's stream, for the last row's sequence (allSessions):
	// read, as every read of a row, from the stream leader.
	rows, err := js.Stream(ctx, kvStream(kv.Bucket()))
	if err != nil {
		return nil, fmt.Errorf("open store: bucket %s: %v: %w", kv.Bucket(), err, store.ErrUnavailable)
	}
	if rows.CachedInfo().Config.AllowDirect {
		return nil, fmt.Errorf("open store: bucket %s: direct gets were switched on again: %w", kv.Bucket(), store.ErrUnavailable)
	}
	s := &Store{
		js:       js,
		kv:       kv,
		rows:     rows,
		rowsSubj: "$KV." + kv.Bucket() + "." + rowKey("*"),
		evName:   upper(cfg.Prefix) + "_EVENTS",
		evSubj:   cfg.Prefix + ".journal.",
		msgSubj:  cfg.Prefix + ".messages.",
	}
	for _, st := range []struct {
		dst  *jetstream.Stream
		name string
		subj string
		desc string
	}{
		{&s.events, s.evName, s.evSubj, "tether event journals: one subject per session, one message per event"},
		{&s.messages, upper(cfg.Prefix) + "_MESSAGES", s.msgSubj, "tether display rows: one subject per session, one message per append"},
	} {
		// An existing stream is used as it is (QuickCheck tells if it
		// was changed to drop messages).
		*st.dst, err = js.Stream(ctx, st.name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			// Direct gets off: a read of a subject's last message is
			// answered by the stream leader, so it sees every
			// acknowledged write.
			*st.dst, err = js.CreateStream(ctx, jetstream.StreamConfig{
				Name:        st.name,
				Description: st.desc,
				Subjects:    []string{st.subj + "*"},
				Storage:     cfg.Storage,
				Replicas:    cfg.Replicas,
				Discard:     jetstream.DiscardOld,
			})
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				// Another host created it meanwhile.
				*st.dst, err = js.Stream(ctx, st.name)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("open store: stream %s: %v: %w", st.name, err, store.ErrUnavailable)
		}
	}
	return s, nil
}

// kvStream is the name of the stream that holds the KV bucket bucket.
func kvStream(bucket string) string { return "KV_" + bucket }

// upper is s in upper case (ASCII).
func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// Close makes every later call fail with store.ErrUnavailable. It is
// idempotent, and does not close the connection.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}

// SetWriteFault is store.Store.SetWriteFault: every write fails with the
// error f returns (when not nil) before it reaches the server.
func (s *Store) SetWriteFault(f func() error) {
	if f == nil {
		s.fault.Store(nil)
		return
	}
	s.fault.Store(&f)
}

// OnWriteFault is store.Store.OnWriteFault.
func (s *Store) OnWriteFault(f func(error)) {
	if f == nil {
		s.onFault.Store(nil)
		return
	}
	s.onFault.Store(&f)
}

// write runs one write operation as store.Store does: an injected fault,
// or any error that is not the caller's (not ErrNotFound, ErrExists or
// ErrInvalid), comes back wrapping store.ErrUnavailable and is reported
// to the OnWriteFault hook.
func (s *Store) write(f func() error) error {
	var err error
	if s.closed.Load() {
		err = fmt.Errorf("store closed: %w", store.ErrUnavailable)
	} else if h := s.fault.Load(); h != nil {
		if ferr := (*h)(); ferr != nil {
			err = fmt.Errorf("%w: %w", ferr, store.ErrUnavailable)
		}
	}
	if err == nil {
		err = f()
	}
	err = storeFault(err)
	if errors.Is(err, store.ErrUnavailable) {
		if h := s.onFault.Load(); h != nil {
			(*h)(err)
		}
	}
	return err
}

// read runs one read: an error that is not the caller's wraps
// store.ErrUnavailable.
func (s *Store) read(f func() error) error {
	if s.closed.Load() {
		return fmt.Errorf("store closed: %w", store.ErrUnavailable)
	}
	return storeFault(f())
}

// storeFault maps an error of the servers to the store's: one that is
// not the caller's wraps store.ErrUnavailable, and one that says the
// servers did not answer or cannot decide now (noAnswer) wraps
// store.ErrUnreachable too.
func storeFault(err error) error {
	if err == nil || callerError(err) {
		return err
	}
	if noAnswer(err) && !errors.Is(err, store.ErrUnreachable) {
		return fmt.Errorf("%w: %w", err, errNoAnswer{})
	}
	if !errors.Is(err, store.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", err, store.ErrUnavailable)
	}
	return err
}

// errNoAnswer is store.ErrUnreachable, which always comes with
// store.ErrUnavailable, said once.
type errNoAnswer struct{}

func (errNoAnswer) Error() string { return store.ErrUnreachable.Error() }
func (errNoAnswer) Is(target error) bool {
	return target == store.ErrUnreachable || target == store.ErrUnavailable
}

// The JetStream API errors that say a request could not be decided now
// rather than that it failed: the cluster has no meta leader
// (JSClusterNotAvailErr), a stream or consumer has no leader (offline),
// or a new leader is still applying its log.
const (
	errCodeClusterNotAvailable   jetstream.ErrorCode = 10008
	errCodeStreamOffline         jetstream.ErrorCode = 10118
	errCodeConsumerOffline       jetstream.ErrorCode = 10119
	errCodeLastPerSubjectPending jetstream.ErrorCode = 10163
)

// noAnswer reports whether err says that the servers did not answer in
// time (no leader to answer: they are electing one, e.g. after a server
// of the cluster went away; or this host is cut off from them) or that
// they cannot decide now, as opposed to refusing or failing the request.
func noAnswer(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case errCodeClusterNotAvailable, errCodeStreamOffline, errCodeConsumerOffline, errCodeLastPerSubjectPending:
			return true
		}
	}
	return false
}

// probeKey is a key the store never writes: reading it asks a leader for
// nothing.
const probeKey = "probe"

// Reachable reports whether the servers answer the store now: the
// cluster's meta leader (which creates the consumers its reads use) and
// the leader of each of its bucket and streams, asked at once for a
// message that does not exist. An error wraps store.ErrUnreachable when
// one of them did not answer within ctx (its servers are electing a
// leader): a caller about to read and write a session's whole history
// asks first with a short bound, rather than have each read wait out its
// timeout.
func (s *Store) Reachable(ctx context.Context) error {
	return s.read(func() error {
		probes := []func() error{
			func() error {
				_, err := s.js.AccountInfo(ctx)
				return err
			},
			func() error {
				_, err := s.kv.Get(ctx, probeKey)
				if errors.Is(err, jetstream.ErrKeyNotFound) {
					return nil
				}
				return err
			},
		}
		for _, st := range []struct {
			stream jetstream.Stream
			subj   string
		}{{s.events, s.evSubj}, {s.messages, s.msgSubj}} {
			probes = append(probes, func() error {
				_, err := st.stream.GetLastMsgForSubject(ctx, st.subj+probeKey)
				if errors.Is(err, jetstream.ErrMsgNotFound) {
					return nil
				}
				return err
			})
		}
		errs := make([]error, len(probes))
		var wg sync.WaitGroup
		for i, p := range probes {
			wg.Go(func() { errs[i] = p() })
		}
		wg.Wait()
		for i, what := range []string{"meta leader", "store bucket's leader", "events stream's leader", "messages stream's leader"} {
			if errs[i] != nil {
				return fmt.Errorf("asking the cluster's %s: %w", what, errs[i])
			}
		}
		return nil
	})
}

// callerError reports whether err is the store refusing an argument
// rather than the storage failing.
func callerError(err error) bool {
	return errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrExists) || errors.Is(err, store.ErrInvalid)
}

// QuickCheck is store.Store.QuickCheck for the cluster: the bucket and
// both streams answer, and are what Open made of them (an error
// wrapping store.ErrDamaged when one is gone or reconfigured,
// store.ErrUnavailable when the servers do not answer).
func (s *Store) QuickCheck(ctx context.Context) error {
	return s.read(func() error {
		if _, err := s.kv.Status(ctx); err != nil {
			if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("quick check: bucket: %v: %w", err, store.ErrDamaged)
			}
			return fmt.Errorf("quick check: bucket: %w", err)
		}
		for _, st := range []jetstream.Stream{s.events, s.messages} {
			info, err := st.Info(ctx)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("quick check: stream %s: %v: %w", st.CachedInfo().Config.Name, err, store.ErrDamaged)
			}
			if err != nil {
				return fmt.Errorf("quick check: stream %s: %w", st.CachedInfo().Config.Name, err)
			}
			if c := info.Config; c.MaxMsgsPerSubject > 0 || c.MaxMsgs > 0 || c.MaxAge > 0 || c.AllowDirect {
				return fmt.Errorf("quick check: stream %s is configured to drop or serve messages behind the store's back: %w", c.Name, store.ErrDamaged)
			}
		}
		return nil
	})
}
