package jsstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/cluster/bus"
	"github.com/tether-agent/tether/host/store"
)

// Commit is store.Store.Commit, as a sequence of writes, session by
// session in the order the batch first names them: its events (each
// checked against the journal's last, so a retried Commit journals none
// twice), its display rows (one stream message), then its row (run seqs,
// run ends, the last cursor, the end) by one compare-and-swap. Unlike the
// SQLite transaction it is not all or nothing: a fault stops it with
// store.ErrUnavailable and leaves what was written before the fault. The
// table's journal tries a failed Commit again with the same entries
// first: that stores no event twice, nor, for a session that has events
// in it, the display rows already stored (see appendMessages).
func (s *Store) Commit(ctx context.Context, b store.Batch, keep store.Retention) error {
	if b.Empty() {
		return nil
	}
	return s.write(func() error {
		var order []string
		seen := map[string]bool{}
		note := func(k string) {
			if !seen[k] {
				seen[k] = true
				order = append(order, k)
			}
		}
		msgs := map[string][]agent.Message{}
		firstEvent := map[string]uint64{}
		for _, e := range b.Events {
			if f, ok := firstEvent[e.Key]; !ok || e.Seq < f {
				firstEvent[e.Key] = e.Seq
			}
		}
		for _, m := range b.Messages {
			note(m.Key)
			msgs[m.Key] = append(msgs[m.Key], m.Message)
		}
		for _, r := range b.RunSeqs {
			note(r.Key)
		}
		for _, r := range b.RunEnds {
			note(r.Key)
		}
		for _, c := range b.Cursors {
			note(c.Key)
		}
		for _, e := range b.Ends {
			note(e.Key)
		}
		if err := s.appendEvents(ctx, b.Events, keep); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		for _, key := range order {
			if len(msgs[key]) > 0 {
				if err := s.appendMessages(ctx, key, msgs[key], firstEvent[key]); err != nil {
					return fmt.Errorf("commit: %w", err)
				}
			}
			err := s.updateRow(ctx, key, func(r *row) (bool, error) {
				changed := false
				for _, rs := range b.RunSeqs {
					for i := range r.Runs {
						if rs.Key == key && r.Runs[i].ID == rs.RunID {
							r.Runs[i].StartSeq, changed = rs.StartSeq, true
						}
					}
				}
				for _, e := range b.RunEnds {
					if e.Key == key && endRunRow(r, e.RunID, e.Status, e.At) {
						changed = true
					}
				}
				for _, c := range b.Cursors {
					if c.Key == key {
						r.Epoch, r.LastSeq, changed = c.Epoch, c.LastSeq, true
					}
				}
				for _, e := range b.Ends {
					if e.Key == key && endRow(r, e.Reason, e.At) {
						changed = true
					}
				}
				return changed, nil
			})
			if errors.Is(err, store.ErrNotFound) {
				// As the SQLite UPDATEs: no row, nothing to change.
				continue
			}
			if err != nil {
				return fmt.Errorf("commit: %w", err)
			}
		}
		return nil
	})
}

// errGap refuses an event that would leave a hole in a journal.
var errGap = errors.New("event seq leaves a gap in the journal")

// AppendEvents is store.Store.AppendEvents: events whose seq is already
// journaled for their session are ignored; then each session it wrote to
// is pruned to the retention bounds. Each event is one message on its
// session's subject, carrying its seq, published only if the subject's
// last message is the one this store read (expected last subject
// sequence): of two hosts journaling one session, a seq is journaled
// once, and in order. A seq beyond the journal's last + 1 is refused
// (store.ErrInvalid) unless the journal is empty.
func (s *Store) AppendEvents(ctx context.Context, events []store.Event, keep store.Retention) error {
	return s.write(func() error { return s.appendEvents(ctx, events, keep) })
}

// journalTop is the last message of a subject: its stream sequence and
// the seq (or row index) in its header, 0 and 0 for an empty subject;
// for a journal, end is the bytes of the session's events up to and with
// it (hdrBefore and its own).
type journalTop struct {
	streamSeq uint64
	seq       uint64
	before    uint64 // its hdrBefore
	end       uint64 // before and its own bytes
}

// lastOf reads the last message of subj from the stream leader.
func lastOf(ctx context.Context, st jetstream.Stream, subj string) (journalTop, *jetstream.RawStreamMsg, error) {
	m, err := st.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return journalTop{}, nil, nil
	}
	if err != nil {
		return journalTop{}, nil, err
	}
	seq, err := strconv.ParseUint(m.Header.Get(hdrSeq), 10, 64)
	if err != nil {
		return journalTop{}, nil, fmt.Errorf("%s: message %d has no seq: %w", subj, m.Sequence, store.ErrDamaged)
	}
	before := bytesBefore(m)
	return journalTop{streamSeq: m.Sequence, seq: seq, before: before, end: before + uint64(len(m.Data))}, m, nil
}

// bytesBefore is a journal message's hdrBefore (0 when it has none).
func bytesBefore(m *jetstream.RawStreamMsg) uint64 {
	n, _ := strconv.ParseUint(m.Header.Get(hdrBefore), 10, 64)
	return n
}

// journalTop is key's last journaled event: from the cache unless
// reread, else from the stream leader (fresh).
func (s *Store) journalTop(ctx context.Context, key string, reread bool) (top journalTop, fresh bool, err error) {
	if !reread {
		if t, ok := s.tops.Load(key); ok {
			return t.(journalTop), false, nil
		}
	}
	top, _, err = lastOf(ctx, s.events, s.evSubj+key)
	if err != nil {
		s.tops.Delete(key)
		return journalTop{}, false, err
	}
	s.tops.Store(key, top)
	return top, true, nil
}

// maxJournalRaces bounds how often appendEvents reads a journal's last
// event again after another writer appended to it.
const maxJournalRaces = 100

func (s *Store) appendEvents(ctx context.Context, events []store.Event, keep store.Retention) error {
	if len(events) == 0 {
		return nil
	}
	keep = keep.WithDefaults()
	byKey := map[string][]store.Event{}
	var order []string
	for _, e := range events {
		if !bus.ValidToken(e.Key) {
			return fmt.Errorf("append event %s/%d: %w", e.Key, e.Seq, store.ErrInvalid)
		}
		if _, ok := byKey[e.Key]; !ok {
			order = append(order, e.Key)
		}
		byKey[e.Key] = append(byKey[e.Key], e)
	}
	var lastStreamSeq uint64
	for _, key := range order {
		evs := byKey[key]
		slices.SortStableFunc(evs, func(a, b store.Event) int { return cmp.Compare(a.Seq, b.Seq) })
		subj := s.evSubj + key
		top, fresh, err := s.journalTop(ctx, key, false)
		if err != nil {
			return fmt.Errorf("append events of %s: %w", key, err)
		}
		wrote := false
		for i, races := 0, 0; i < len(evs); {
			e := evs[i]
			if e.Seq <= top.seq {
				i++ // journaled already
				continue
			}
			if top.seq > 0 && e.Seq != top.seq+1 {
				if !fresh {
					// The cache may be behind another host's appends.
					if top, fresh, err = s.journalTop(ctx, key, true); err != nil {
						return fmt.Errorf("append events of %s: %w", key, err)
					}
					continue
				}
				return fmt.Errorf("append event %s/%d after %d: %w: %w", key, e.Seq, top.seq, errGap, store.ErrInvalid)
			}
			msg := nats.NewMsg(subj)
			msg.Header.Set(hdrSeq, strconv.FormatUint(e.Seq, 10))
			msg.Header.Set(hdrBefore, strconv.FormatUint(top.end, 10))
			msg.Data = e.Params
			var ack *jetstream.PubAck
			err := bus.RetryBusy(ctx, &s.retries, func() (err error) {
				ack, err = s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(top.streamSeq), jetstream.WithExpectStream(s.evName))
				return err
			})
			if bus.WrongLastSequence(err) && !bus.Busy(err) && races < maxJournalRaces {
				// Another writer journaled meanwhile: read its last.
				races++
				if top, fresh, err = s.journalTop(ctx, key, true); err != nil {
					return fmt.Errorf("append events of %s: %w", key, err)
				}
				continue
			}
			if err != nil {
				s.tops.Delete(key)
				return fmt.Errorf("append event %s/%d: %w", key, e.Seq, err)
			}
			top = journalTop{streamSeq: ack.Sequence, seq: e.Seq, before: top.end, end: top.end + uint64(len(e.Params))}
			s.tops.Store(key, top)
			lastStreamSeq = max(lastStreamSeq, ack.Sequence)
			wrote = true
			i++
		}
		if wrote && top.seq > uint64(keep.PerSession) {
			if err := s.events.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeKeep(uint64(keep.PerSession))); err != nil {
				return fmt.Errorf("prune events of %s: %w", key, err)
			}
		}
		if wrote {
			if err := s.pruneBytes(ctx, key, top, uint64(keep.PerSessionBytes)); err != nil {
				return fmt.Errorf("prune events of %s: %w", key, err)
			}
		}
	}
	// The stream holds at most lastStreamSeq messages: prune it only
	// once that could exceed the total.
	if lastStreamSeq > uint64(keep.Total) {
		if err := s.events.Purge(ctx, jetstream.WithPurgeKeep(uint64(keep.Total))); err != nil {
			return fmt.Errorf("prune events: %w", err)
		}
	}
	return nil
}

// maxPruneReads bounds the reads pruneBytes makes to find where the
// newest events that fit the bound begin.
const maxPruneReads = 64

// pruneBytes removes key's oldest events while its journal, whose last
// event is top, holds more than most bytes, never its newest one: it
// finds the first event whose hdrBefore is at least top.end - most (the
// headers only grow along the journal) and purges the subject before it.
// A journal under the bound by the first-event lower bound this process
// last read (floors) is not read at all; else its first event is read,
// and only a journal over the bound is searched: lo's next event first
// (the common case: one commit's worth over), then by halving the
// stream sequences between the last event known to go and the first
// known to stay.
func (s *Store) pruneBytes(ctx context.Context, key string, top journalTop, most uint64) error {
	if top.end <= most {
		return nil
	}
	threshold := top.end - most // the first event kept starts at or after it
	if f, ok := s.floors.Load(key); ok && f.(uint64) >= threshold {
		return nil
	}
	subj := s.evSubj + key
	get := func(from uint64) (*jetstream.RawStreamMsg, error) {
		return s.events.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subj))
	}
	lo, err := get(1)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // pruned meanwhile
	}
	if err != nil {
		return err
	}
	s.floors.Store(key, bytesBefore(lo))
	if bytesBefore(lo) >= threshold || lo.Sequence >= top.streamSeq {
		return nil
	}
	// lo goes; the first event kept is cut, or one in (lo, hi), the
	// stream sequences not read yet (top when even it alone is over).
	cut, cutBefore, hi := top.streamSeq, top.before, top.streamSeq
	next := lo.Sequence + 1
	for reads := 0; lo.Sequence+1 < hi && reads < maxPruneReads; reads++ {
		m, err := get(next)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			hi = next // pruned meanwhile
		case err != nil:
			return err
		case m.Sequence >= hi:
			hi = next // no event of key in [next, hi)
		case bytesBefore(m) >= threshold:
			cut, cutBefore, hi = m.Sequence, bytesBefore(m), next // none in [next, m)
		default:
			lo = m
		}
		next = lo.Sequence + 1 + (hi-lo.Sequence-1)/2
	}
	if err := s.events.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(cut)); err != nil {
		return err
	}
	s.floors.Store(key, cutBefore)
	return nil
}

// fetchWait bounds a read of messages the stream said it holds (they
// could only be missing if pruned meanwhile).
const fetchWait = 5 * time.Second

// readSubject calls fn with the messages of subj in st from stream
// sequence from on, while fn asks for more. known is how many the subject
// holds from there, at least; fn returns the same after the message it
// was given (0 when it wants no more). A fetch asks for no more than
// that, so it returns as soon as it has them instead of waiting for
// messages that do not exist.
func (s *Store) readSubject(ctx context.Context, st jetstream.Stream, subj string, from uint64, known int, fn func(m jetstream.Msg) (int, error)) error {
	if known <= 0 {
		return nil
	}
	// A consumer of this read only: not acknowledged, in memory, on one
	// server, deleted when the read is done (and by the server after
	// a while if that delete is lost).
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     subj,
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       max(from, 1),
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fetchWait)
		defer cancel()
		_ = st.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()
	ctx, cancel := context.WithTimeout(ctx, fetchWait)
	defer cancel()
	wait := time.Millisecond
	for known > 0 {
		batch, err := cons.Fetch(min(known, 1000), jetstream.FetchContext(ctx))
		if err != nil {
			return err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if known > 0 && err == nil {
				known, err = fn(m)
			}
		}
		berr := batch.Error()
		if n == 0 && errors.Is(berr, nats.ErrNoResponders) && err == nil {
			// On a cluster, the new consumer's server may not yet be
			// known to the one this connection is on: ask again.
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("%w (asked again until: %w)", berr, ctx.Err())
			case <-t.C:
			}
			wait = min(2*wait, 50*time.Millisecond)
			continue
		}
		if berr != nil && err == nil {
			err = berr
		}
		if err != nil {
			return err
		}
		if n == 0 && known > 0 {
			return fmt.Errorf("%s: expected %d more messages, got none", subj, known)
		}
	}
	return nil
}

// seqOf is the seq header of m.
func seqOf(m jetstream.Msg) (uint64, error) {
	seq, err := strconv.ParseUint(m.Headers().Get(hdrSeq), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: a message has no seq: %w", m.Subject(), store.ErrDamaged)
	}
	return seq, nil
}

// EventsSince is store.Store.EventsSince: the bounds come from the
// subject's first and last messages; the events from a consumer of the
// subject started where seek found the first one wanted.
func (s *Store) EventsSince(ctx context.Context, key string, after uint64, limit int) (events []store.Event, first, last uint64, err error) {
	if limit <= 0 {
		limit = 10000
	}
	err = s.read(func() error {
		if !bus.ValidToken(key) {
			return nil
		}
		subj := s.evSubj + key
		top, _, err := lastOf(ctx, s.events, subj)
		if err != nil || top.seq == 0 {
			return err
		}
		fm, err := s.events.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil // pruned meanwhile
		}
		if err != nil {
			return err
		}
		firstSeq, err := strconv.ParseUint(fm.Header.Get(hdrSeq), 10, 64)
		if err != nil {
			return fmt.Errorf("%s: message %d has no seq: %w", subj, fm.Sequence, store.ErrDamaged)
		}
		first, last = firstSeq, top.seq
		start := max(after+1, first)
		if start > last {
			return nil
		}
		end := min(last, start+uint64(limit)-1)
		from, err := s.seek(ctx, subj, start, journalTop{streamSeq: fm.Sequence, seq: first}, top)
		if err != nil {
			return err
		}
		events = make([]store.Event, 0, end-start+1)
		return s.readSubject(ctx, s.events, subj, from.streamSeq, int(last-from.seq+1), func(m jetstream.Msg) (int, error) {
			seq, err := seqOf(m)
			if err != nil {
				return 0, err
			}
			if seq >= start {
				events = append(events, store.Event{Key: key, Seq: seq, Params: append(json.RawMessage(nil), m.Data()...)})
			}
			if seq >= end {
				return 0, nil
			}
			return int(last - seq), nil
		})
	})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("events of %s since %d: %w", key, after, err)
	}
	return events, first, last, nil
}

// maxSeeks bounds the reads seek makes.
const maxSeeks = 8

// seek returns a message of subj at or before the event start, as close
// to it as a few reads find, given two messages around it (lo.seq <=
// start <= hi.seq). A journal has no gaps, so event start is at least
// start-lo.seq stream messages after lo and hi.seq-start before hi; seek
// guesses its place between them in proportion (other sessions'
// messages are spread evenly, roughly) and reads the subject's first
// message from the guess on, which narrows one side. A journal alone in
// the stream is found by the first guess.
func (s *Store) seek(ctx context.Context, subj string, start uint64, lo, hi journalTop) (journalTop, error) {
	for range maxSeeks {
		if lo.seq >= start || hi.seq <= lo.seq {
			break
		}
		guess := lo.streamSeq + (hi.streamSeq-lo.streamSeq)*(start-lo.seq)/(hi.seq-lo.seq)
		guess = max(guess, lo.streamSeq+(start-lo.seq))
		guess = min(guess, hi.streamSeq-(hi.seq-start))
		m, err := s.events.GetMsg(ctx, guess, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break // pruned meanwhile: read from lo
		}
		if err != nil {
			return journalTop{}, err
		}
		seq, err := strconv.ParseUint(m.Header.Get(hdrSeq), 10, 64)
		if err != nil {
			return journalTop{}, fmt.Errorf("%s: message %d has no seq: %w", subj, m.Sequence, store.ErrDamaged)
		}
		at := journalTop{streamSeq: m.Sequence, seq: seq}
		if seq <= start {
			lo = at
		} else {
			hi = at
		}
	}
	return lo, nil
}

// keyLock is the mutex of key's messages writers in this process.
func (s *Store) keyLock(key string) *sync.Mutex {
	mu, _ := s.keyLocks.LoadOrStore(key, new(sync.Mutex))
	return mu.(*sync.Mutex)
}
