package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// relayViewer is one viewer of the cluster-relay row's session: when each
// delta and completion arrived on its socket.
type relayViewer struct {
	name     string
	conn     *client.Conn
	complete chan uint64 // the seq of each message.complete

	mu  sync.Mutex
	at  map[uint64]time.Time // first arrival of each seq
	typ map[uint64]string    // its event type
}

func newRelayViewer(name string) *relayViewer {
	return &relayViewer{name: name, complete: make(chan uint64, 64), at: map[uint64]time.Time{}, typ: map[uint64]string{}}
}

// onEvent runs on the socket's reader goroutine: it stamps the event
// before anything else.
func (v *relayViewer) onEvent(ev client.Event) {
	now := time.Now()
	if ev.Seq == 0 {
		return
	}
	v.mu.Lock()
	if _, ok := v.at[ev.Seq]; !ok {
		v.at[ev.Seq], v.typ[ev.Seq] = now, ev.Type
	}
	v.mu.Unlock()
	if ev.Type == "message.complete" {
		select {
		case v.complete <- ev.Seq:
		default:
		}
	}
}

func (v *relayViewer) arrival(seq uint64) (time.Time, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.at[seq]
	return t, ok
}

func (v *relayViewer) eventType(seq uint64) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.typ[seq]
}

// rowClusterRelay measures what the relay between hosts adds to event
// delivery: one session owned by h1, two viewers on h1 and one on h2
// (resumed there). Prompts to the echo agent stream one delta per word;
// per delta, the arrival on h2 minus the arrival on the first h1 viewer
// is the relay's added latency, and the arrival on the second h1 viewer
// minus the first is the same-host baseline. Prompts alternate between
// the h1 and the h2 viewer, to time submit → message.complete both ways.
func rowClusterRelay(cfg config, rep *report) error {
	o := cfg.cluster
	cl, err := startCluster(cfg.bin, tetherOpts{extra: []string{"--echo-delay", o.echoDelay.String()}})
	if err != nil {
		return err
	}
	defer cl.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	rr := &relayRun{ctx: ctx, o: o, a: newRelayViewer("h1"), b: newRelayViewer("h1'"), c: newRelayViewer("h2")}
	defer rr.close()
	if err := rr.connect(cl); err != nil {
		return err
	}
	// A warm-up prompt from each side, not measured.
	for _, v := range []*relayViewer{rr.a, rr.c} {
		if _, _, err := rr.prompt(v); err != nil {
			return err
		}
	}

	var cross50, cross99, same50, same99 sample
	var h1h1, h1h2, h2h2, h2h1 sample // submit on X → complete on Y, medians
	var allCross, allSame []float64
	missing := 0
	deltas := 0
	for r := 0; r < cfg.n; r++ {
		waitQuiet(2 * time.Second)
		m, err := rr.measure()
		if err != nil {
			return err
		}
		missing += m.missing
		deltas += len(m.cross)
		cross50.add(percentile(m.cross, .5))
		cross99.add(percentile(m.cross, .99))
		same50.add(percentile(m.same, .5))
		same99.add(percentile(m.same, .99))
		h1h1.add(median(m.t11))
		h1h2.add(median(m.t12))
		h2h2.add(median(m.t22))
		h2h1.add(median(m.t21))
		allCross = append(allCross, m.cross...)
		allSame = append(allSame, m.same...)
		logf(cfg, "cluster-relay rep %d: %d deltas; h2−h1 p50 %.3fms p99 %.3fms; h1'−h1 p50 %.3fms p99 %.3fms; submit→complete h1→h1 %.1fms h1→h2 %.1fms h2→h2 %.1fms h2→h1 %.1fms",
			r, len(m.cross), percentile(m.cross, .5), percentile(m.cross, .99), percentile(m.same, .5), percentile(m.same, .99), median(m.t11), median(m.t12), median(m.t22), median(m.t21))
	}
	row := fmt.Sprintf("cluster-relay %d words at %v", o.words, o.echoDelay)
	rep.add(result{row: row, metric: "delta on h2 − on h1, p50 (baseline: 2nd h1 viewer − 1st)", tether: cross50.cell("ms"), baseline: same50.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "delta on h2 − on h1, p99 (baseline: 2nd h1 viewer − 1st)", tether: cross99.cell("ms"), baseline: same99.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "submit on h1 → complete on h1, median", tether: h1h1.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "submit on h1 → complete on h2, median", tether: h1h2.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "submit on h2 → complete on h2, median", tether: h2h2.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "submit on h2 → complete on h1, median", tether: h2h1.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "deltas seen by all 3 viewers", tether: fmt.Sprintf("%d/%d", deltas, deltas+missing),
		target: "all", met: yesNo(missing == 0), n: cfg.n})
	rep.note("%s: one session owned by h1, viewers h1 and h1' (both on h1) and h2 (resumed there, relayed over NATS); %d prompts per repetition alternating h1/h2 as submitter (after one unmeasured prompt from each); per delta, arrival time on each socket in the harness; pooled over all repetitions: h2−h1 p50 %.3f ms p99 %.3f ms max %.3f ms, h1'−h1 p50 %.3f ms p99 %.3f ms; the echo agent's own pacing is %d × %v = %v per prompt",
		row, o.prompts, percentile(allCross, .5), percentile(allCross, .99), percentile(allCross, 1), percentile(allSame, .5), percentile(allSame, .99), o.words, o.echoDelay, time.Duration(o.words)*o.echoDelay)
	return nil
}

// relayRun is the cluster-relay row's session and its three viewers: a
// and b on h1, c on h2.
type relayRun struct {
	ctx          context.Context
	o            clusterOpts
	a, b, c      *relayViewer
	sid          string
	text         string // the prompt: o.words words
	lastComplete uint64 // seq of the last message.complete
}

// connect dials the viewers, creates the session from a and resumes it
// on b and c.
func (rr *relayRun) connect(cl *cluster) error {
	var err error
	for _, v := range []struct {
		rv *relayViewer
		s  *server
	}{{rr.a, cl.hosts[0]}, {rr.b, cl.hosts[0]}, {rr.c, cl.hosts[1]}} {
		if v.rv.conn, err = dialHost(rr.ctx, v.s, v.rv.onEvent); err != nil {
			return err
		}
	}
	snap, err := rr.a.conn.Create(rr.ctx, wire.CreateParams{Title: "cluster-relay"})
	if err != nil {
		return err
	}
	rr.sid = snap.SessionID
	for _, v := range []*relayViewer{rr.b, rr.c} {
		s, err := v.conn.Resume(rr.ctx, wire.ResumeParams{SessionID: snap.SessionKey})
		if err != nil {
			return fmt.Errorf("resume on %s: %w", v.name, err)
		}
		if s.SessionID != rr.sid {
			return fmt.Errorf("resume on %s gave session %s, want the live %s", v.name, s.SessionID, rr.sid)
		}
	}
	var words []string
	for i := range rr.o.words {
		words = append(words, fmt.Sprintf("w%d", i+1))
	}
	rr.text = strings.Join(words, " ")
	rr.lastComplete = snap.LatestSeq
	return nil
}

// close closes the viewers' sockets.
func (rr *relayRun) close() {
	for _, v := range []*relayViewer{rr.a, rr.b, rr.c} {
		if v.conn != nil {
			v.conn.Abort()
		}
	}
}

// prompt submits the text from the viewer from, waits for the completion
// on all three viewers and returns the seqs of the events after the last
// completion up to this one (its deltas among them) and submit → complete
// on each viewer.
func (rr *relayRun) prompt(from *relayViewer) ([]uint64, map[string]time.Duration, error) {
	t0 := time.Now()
	if _, err := from.conn.Submit(rr.ctx, rr.sid, rr.text); err != nil {
		return nil, nil, fmt.Errorf("submit on %s: %w", from.name, err)
	}
	took := map[string]time.Duration{}
	var end uint64
	for _, v := range []*relayViewer{rr.a, rr.b, rr.c} {
		select {
		case seq := <-v.complete:
			at, _ := v.arrival(seq)
			took[v.name] = at.Sub(t0)
			if end != 0 && seq != end {
				return nil, nil, fmt.Errorf("message.complete seq %d on %s, %d on another viewer", seq, v.name, end)
			}
			end = seq
		case <-time.After(time.Minute + time.Duration(rr.o.words)*rr.o.echoDelay):
			return nil, nil, fmt.Errorf("no message.complete on %s", v.name)
		}
	}
	var seqs []uint64
	for s := rr.lastComplete + 1; s < end; s++ {
		seqs = append(seqs, s)
	}
	rr.lastComplete = end
	return seqs, took, nil
}

// relayMeasure is one repetition of the cluster-relay row, in ms.
type relayMeasure struct {
	cross, same        []float64 // per delta: on h2 − on h1, on h1' − on h1
	t11, t12, t22, t21 []float64 // submit on X → complete on Y, per prompt
	missing            int       // deltas some viewer did not see
}

// measure runs o.prompts prompts, alternately from a and from c.
func (rr *relayRun) measure() (relayMeasure, error) {
	a, b, c := rr.a, rr.b, rr.c
	var m relayMeasure
	for k := 0; k < rr.o.prompts; k++ {
		from := a
		if k%2 == 1 {
			from = c
		}
		seqs, took, err := rr.prompt(from)
		if err != nil {
			return m, err
		}
		n := 0
		for _, s := range seqs {
			if a.eventType(s) != "message.delta" && b.eventType(s) != "message.delta" && c.eventType(s) != "message.delta" {
				continue // the run's other events
			}
			n++
			ta, okA := a.arrival(s)
			tb, okB := b.arrival(s)
			tc, okC := c.arrival(s)
			if !okA || !okB || !okC {
				m.missing++
				continue
			}
			m.cross = append(m.cross, ms(tc.Sub(ta)))
			m.same = append(m.same, ms(tb.Sub(ta)))
		}
		if n != rr.o.words {
			return m, fmt.Errorf("prompt of %d words: %d message.delta events between its completion and the last", rr.o.words, n)
		}
		if from == a {
			m.t11 = append(m.t11, ms(took[a.name]))
			m.t12 = append(m.t12, ms(took[c.name]))
		} else {
			m.t22 = append(m.t22, ms(took[c.name]))
			m.t21 = append(m.t21, ms(took[a.name]))
		}
	}
	return m, nil
}
