package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/testing/hostproc"
	"github.com/tether-agent/tether/wire"
)

// clusterOpts configure the cluster rows (issue 16).
type clusterOpts struct {
	words     int           // cluster-relay: words per prompt (one message.delta each)
	prompts   int           // cluster-relay: measured prompts per repetition
	echoDelay time.Duration // cluster-relay: tether --echo-delay
	storm     int           // cluster-storm: sockets resuming one key at once
	ttl       time.Duration // cluster-failover: tether --cluster-ttl
	failovers int           // cluster-failover: kills per repetition
	ptySize   int64         // cluster-pty: bytes per stream
	reattach  int           // cluster-pty: attaches per host and kind per repetition
}

// clusterRows are the rows that start three hosts sharing one session
// table; "-rows cluster" selects them all.
var clusterRows = []string{"cluster-relay", "cluster-storm", "cluster-failover", "cluster-pty"}

// cluster is three `tether serve` processes, each with an embedded NATS
// server routed with the two others (--cluster embedded), as the README's
// three-host set-up runs them.
type cluster struct {
	bin   string
	hosts []*server    // h1, h2, h3; nil while one is down
	opts  []tetherOpts // how each was started, to start it again in place
}

// startCluster starts three hosts with o (each its own state dir, token
// and host id h1..h3) at once — each waits for the others for its
// JetStream quorum before it prints its URL — and returns when all three
// serve.
func startCluster(bin string, o tetherOpts) (*cluster, error) {
	addrs, err := hostproc.FreeAddrs(6)
	if err != nil {
		return nil, err
	}
	clientAddrs, routeAddrs := addrs[:3], addrs[3:]
	var routes []string
	for _, r := range routeAddrs {
		routes = append(routes, "nats-route://"+r)
	}
	secret, err := clusterSecret(bin)
	if err != nil {
		return nil, err
	}
	c := &cluster{bin: bin, hosts: make([]*server, 3), opts: make([]tetherOpts, 3)}
	for i := range c.opts {
		d, err := os.MkdirTemp(tmpRoot, fmt.Sprintf("state-h%d-", i+1))
		if err != nil {
			return nil, err
		}
		h := o
		h.stateDir = d
		h.wait = 90 * time.Second
		h.extra = append(slices.Clone(o.extra),
			"--cluster", "embedded",
			"--cluster-secret-file", secret,
			"--cluster-listen", clientAddrs[i],
			"--cluster-route-listen", routeAddrs[i],
			"--cluster-routes", strings.Join(routes, ","),
			"--host-id", fmt.Sprintf("h%d", i+1))
		c.opts[i] = h
	}
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range c.hosts {
		wg.Go(func() { c.hosts[i], errs[i] = startTether(bin, c.opts[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.stop()
		return nil, fmt.Errorf("starting a 3-host cluster: %w", err)
	}
	return c, nil
}

// clusterSecret makes the cluster's shared secret as the README does,
// (umask 077; tether cluster secret > FILE), in tmpRoot, and returns the
// file's path.
func clusterSecret(bin string) (string, error) {
	f, err := os.CreateTemp(tmpRoot, "cluster-secret-") // mode 0600
	if err != nil {
		return "", err
	}
	defer f.Close()
	cmd := exec.Command(bin, "cluster", "secret")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = f, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("tether cluster secret: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return f.Name(), nil
}

// restart starts host i again on its state dir and cluster addresses
// (after a kill): it rejoins the two others.
func (c *cluster) restart(i int) error {
	s, err := startTether(c.bin, c.opts[i])
	if err != nil {
		return fmt.Errorf("restarting h%d: %w", i+1, err)
	}
	c.hosts[i] = s
	return nil
}

// stop kills the three hosts at once: a graceful stop of the last two
// would wait for a quorum that left with the first.
func (c *cluster) stop() {
	var wg sync.WaitGroup
	for _, s := range c.hosts {
		if s != nil {
			wg.Go(s.kill)
		}
	}
	wg.Wait()
}

// state says, for an error message, whether each host still runs and
// what it last logged.
func (c *cluster) state() string {
	var b strings.Builder
	for i, s := range c.hosts {
		if s == nil {
			fmt.Fprintf(&b, "\nh%d: down", i+1)
			continue
		}
		st := "running"
		select {
		case <-s.exited:
			st = fmt.Sprintf("exited (%v)", s.waitErr)
		default:
		}
		log := s.stderr.all()
		fmt.Fprintf(&b, "\nh%d: %s; log tail:\n%s", i+1, st, log[max(0, len(log)-1500):])
	}
	return b.String()
}

// dialHost opens a JSON-RPC socket to s.
func dialHost(ctx context.Context, s *server, onEvent func(client.Event)) (*client.Conn, error) {
	return client.Dial(ctx, s.baseURL(), client.Options{Token: s.token, OnEvent: onEvent})
}

// retryable reports whether err is one a cluster answers while a
// session's owner or the storage is changing hands: 5002 (owner
// unreachable) or 5003 (storage unavailable).
func retryable(err error) bool {
	code := client.ErrorCode(err)
	return code == wire.CodeOwnerUnreachable || code == wire.CodeStorageUnavailable
}

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

	a, b, c := newRelayViewer("h1"), newRelayViewer("h1'"), newRelayViewer("h2")
	for _, v := range []struct {
		rv *relayViewer
		s  *server
	}{{a, cl.hosts[0]}, {b, cl.hosts[0]}, {c, cl.hosts[1]}} {
		if v.rv.conn, err = dialHost(ctx, v.s, v.rv.onEvent); err != nil {
			return err
		}
		defer v.rv.conn.Abort()
	}
	snap, err := a.conn.Create(ctx, wire.CreateParams{Title: "cluster-relay"})
	if err != nil {
		return err
	}
	sid := snap.SessionID
	for _, v := range []*relayViewer{b, c} {
		s, err := v.conn.Resume(ctx, wire.ResumeParams{SessionID: snap.SessionKey})
		if err != nil {
			return fmt.Errorf("resume on %s: %w", v.name, err)
		}
		if s.SessionID != sid {
			return fmt.Errorf("resume on %s gave session %s, want the live %s", v.name, s.SessionID, sid)
		}
	}
	var words []string
	for i := range o.words {
		words = append(words, fmt.Sprintf("w%d", i+1))
	}
	text := strings.Join(words, " ")

	// prompt submits the text from the viewer from, waits for the
	// completion on all three viewers and returns the seqs of the events
	// after the last completion up to this one (its deltas among them)
	// and submit → complete on each viewer.
	lastComplete := snap.LatestSeq
	prompt := func(from *relayViewer) ([]uint64, map[string]time.Duration, error) {
		t0 := time.Now()
		if _, err := from.conn.Submit(ctx, sid, text); err != nil {
			return nil, nil, fmt.Errorf("submit on %s: %w", from.name, err)
		}
		took := map[string]time.Duration{}
		var end uint64
		for _, v := range []*relayViewer{a, b, c} {
			select {
			case seq := <-v.complete:
				at, _ := v.arrival(seq)
				took[v.name] = at.Sub(t0)
				if end != 0 && seq != end {
					return nil, nil, fmt.Errorf("message.complete seq %d on %s, %d on another viewer", seq, v.name, end)
				}
				end = seq
			case <-time.After(time.Minute + time.Duration(o.words)*o.echoDelay):
				return nil, nil, fmt.Errorf("no message.complete on %s", v.name)
			}
		}
		var seqs []uint64
		for s := lastComplete + 1; s < end; s++ {
			seqs = append(seqs, s)
		}
		lastComplete = end
		return seqs, took, nil
	}
	// A warm-up prompt from each side, not measured.
	for _, v := range []*relayViewer{a, c} {
		if _, _, err := prompt(v); err != nil {
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
		var cross, same []float64
		var t11, t12, t22, t21 []float64
		for k := 0; k < o.prompts; k++ {
			from := a
			if k%2 == 1 {
				from = c
			}
			seqs, took, err := prompt(from)
			if err != nil {
				return err
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
					missing++
					continue
				}
				deltas++
				cross = append(cross, ms(tc.Sub(ta)))
				same = append(same, ms(tb.Sub(ta)))
			}
			if n != o.words {
				return fmt.Errorf("prompt of %d words: %d message.delta events between its completion and the last", o.words, n)
			}
			if from == a {
				t11 = append(t11, ms(took[a.name]))
				t12 = append(t12, ms(took[c.name]))
			} else {
				t22 = append(t22, ms(took[c.name]))
				t21 = append(t21, ms(took[a.name]))
			}
		}
		cross50.add(percentile(cross, .5))
		cross99.add(percentile(cross, .99))
		same50.add(percentile(same, .5))
		same99.add(percentile(same, .99))
		h1h1.add(median(t11))
		h1h2.add(median(t12))
		h2h2.add(median(t22))
		h2h1.add(median(t21))
		allCross = append(allCross, cross...)
		allSame = append(allSame, same...)
		logf(cfg, "cluster-relay rep %d: %d deltas; h2−h1 p50 %.3fms p99 %.3fms; h1'−h1 p50 %.3fms p99 %.3fms; submit→complete h1→h1 %.1fms h1→h2 %.1fms h2→h2 %.1fms h2→h1 %.1fms",
			r, len(cross), percentile(cross, .5), percentile(cross, .99), percentile(same, .5), percentile(same, .99), median(t11), median(t12), median(t22), median(t21))
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

// raceLost reports whether err is 4007 "session no longer live; retry
// resume": the resume kept losing races for the key (PROTOCOL.md says
// retry), not the 4007 of a key that does not exist.
func raceLost(err error) bool {
	return client.ErrorCode(err) == wire.CodeStoredNotFound && strings.Contains(err.Error(), "retry")
}

// rowClusterStorm: the resume storm across three hosts. Per repetition a
// session is created on h1 and closed (stored, not live); cfg.cluster.storm
// sockets spread evenly over h1..h3 resume its key at once, retrying on
// 5002/5003 and on 4007 "no longer live; retry resume" every 20 ms;
// latency per socket from the release to its answer. Exactly one session must result: one id in every answer, and
// one live session for the key in every host's session.active_list.
func rowClusterStorm(cfg config, rep *report) error {
	o := cfg.cluster
	cl, err := startCluster(cfg.bin, tetherOpts{})
	if err != nil {
		return err
	}
	defer cl.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ctls := make([]*client.Conn, 3)
	for i, h := range cl.hosts {
		if ctls[i], err = dialHost(ctx, h, nil); err != nil {
			return err
		}
		defer ctls[i].Abort()
	}

	var p50, p99, pmax, retried sample
	exact := 0
	var bad []string
	retries := map[int]int{}
	for r := 0; r < cfg.n; r++ {
		snap, err := ctls[0].Create(ctx, wire.CreateParams{Title: fmt.Sprintf("cluster-storm-%d", r)})
		if err != nil {
			return err
		}
		if _, err := ctls[0].CloseSession(ctx, snap.SessionID); err != nil {
			return err
		}
		var socks []*client.Conn
		var hostOf []int
		for i, h := range cl.hosts {
			k := o.storm / 3
			if i < o.storm%3 {
				k++
			}
			cs, err := dialMany(ctx, h, k)
			if err != nil {
				return fmt.Errorf("dialing %d sockets to h%d: %w", k, i+1, err)
			}
			socks = append(socks, cs...)
			for range cs {
				hostOf = append(hostOf, i)
			}
		}
		lat := make([]time.Duration, len(socks))
		ids := make([]string, len(socks))
		errs := make([]error, len(socks))
		tries := make([]map[int]int, len(socks))
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for i, c := range socks {
			wg.Go(func() {
				tries[i] = map[int]int{}
				<-gate
				t0 := time.Now()
				for {
					cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
					s, err := c.Resume(cctx, wire.ResumeParams{SessionID: snap.SessionKey})
					ccancel()
					if err == nil {
						lat[i], ids[i] = time.Since(t0), s.SessionID
						return
					}
					if !retryable(err) && !raceLost(err) || time.Since(t0) > 30*time.Second {
						errs[i] = err
						return
					}
					tries[i][client.ErrorCode(err)]++
					time.Sleep(20 * time.Millisecond) // the client's retry backoff
				}
			})
		}
		time.Sleep(50 * time.Millisecond) // every goroutine parked at the gate
		close(gate)
		wg.Wait()
		distinct := map[string]bool{}
		nRetried := 0
		for i := range socks {
			if errs[i] != nil {
				return fmt.Errorf("resume %d on h%d: %w", i, hostOf[i]+1, errs[i])
			}
			distinct[ids[i]] = true
			if len(tries[i]) > 0 {
				nRetried++
			}
			for code, k := range tries[i] {
				retries[code] += k
			}
		}
		ok := len(distinct) == 1
		var lives []string
		for i, ctl := range ctls {
			active, err := ctl.ActiveList(ctx)
			if err != nil {
				return err
			}
			live, viewers := 0, 0
			for _, s := range active {
				if s.SessionKey == snap.SessionKey {
					live++
					viewers = s.Viewers
					ok = ok && distinct[s.ID]
				}
			}
			ok = ok && live == 1 && viewers == len(socks)
			lives = append(lives, fmt.Sprintf("h%d: %d live, %d viewers", i+1, live, viewers))
		}
		if ok {
			exact++
		} else {
			bad = append(bad, fmt.Sprintf("rep %d: %d distinct ids answered; %s", r, len(distinct), strings.Join(lives, ", ")))
		}
		lms := durationsMS(lat)
		p50.add(percentile(lms, .5))
		p99.add(percentile(lms, .99))
		pmax.add(percentile(lms, 1))
		retried.add(float64(nRetried))
		logf(cfg, "cluster-storm rep %d: p50 %.2fms p99 %.2fms max %.2fms; %d sockets retried; %s", r, percentile(lms, .5), percentile(lms, .99), percentile(lms, 1), nRetried, strings.Join(lives, ", "))
		for id := range distinct {
			if _, err := ctls[0].CloseSession(ctx, id); err != nil {
				return err
			}
		}
		for _, c := range socks {
			c.Abort()
		}
		time.Sleep(500 * time.Millisecond) // the hosts tear down the viewers
		waitQuiet(3 * time.Second)
	}
	row := fmt.Sprintf("cluster-storm ×%d over 3 hosts", o.storm)
	rep.add(result{row: row, metric: "p50", tether: p50.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "p99", tether: p99.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "max", tether: pmax.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "sockets that retried", tether: retried.cell(""), n: cfg.n})
	rep.add(result{row: row, metric: "one live session", tether: fmt.Sprintf("%d/%d", exact, cfg.n),
		target: "every repetition", met: yesNo(exact == cfg.n), n: cfg.n})
	rep.note("%s: retries over all repetitions: %d × 5002, %d × 5003, %d × 4007 \"session no longer live; retry resume\" (every 20 ms until answered); latency is from the release to the successful answer, retries included", row, retries[wire.CodeOwnerUnreachable], retries[wire.CodeStorageUnavailable], retries[wire.CodeStoredNotFound])
	for _, b := range bad {
		rep.note("%s: %s", row, b)
	}
	if exact != cfg.n {
		return fmt.Errorf("%d of %d storms did not end with exactly one session", cfg.n-exact, cfg.n)
	}
	return nil
}

// rowClusterFailover: kill -9 of the host owning a session. Per
// repetition a fresh cluster with --cluster-ttl; then cfg.cluster.failovers
// times: a session is created on h2, h2 is killed (its whole process
// group: the host with its embedded NATS server, and its plugins), and a
// client on h1 calls session.resume of its key every 50 ms until it
// succeeds; the time from the kill to that success. h2 is then started
// again on its state dir, and rejoins, before the next kill.
func rowClusterFailover(cfg config, rep *report) error {
	o := cfg.cluster
	var p50, pmax, setupRetries sample
	var all []float64
	codes := map[int]int{}
	for r := 0; r < cfg.n; r++ {
		waitQuiet(5 * time.Second)
		took, retriesBefore, err := failoverRep(cfg, codes)
		if err != nil {
			return fmt.Errorf("repetition %d: %w", r, err)
		}
		tms := durationsMS(took)
		all = append(all, tms...)
		p50.add(percentile(tms, .5))
		pmax.add(percentile(tms, 1))
		setupRetries.add(float64(retriesBefore))
		logf(cfg, "cluster-failover rep %d: %v", r, took)
	}
	row := fmt.Sprintf("cluster-failover, --cluster-ttl %v", o.ttl)
	rep.add(result{row: row, metric: fmt.Sprintf("kill -9 → resumed on h1, p50 of %d", o.failovers), tether: p50.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: fmt.Sprintf("kill -9 → resumed on h1, max of %d", o.failovers), tether: pmax.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: fmt.Sprintf("pooled p50 / p99 of %d", len(all)), tether: fmt.Sprintf("%s / %s ms", num(percentile(all, .5)), num(percentile(all, .99))), n: cfg.n})
	rep.note("%s: a fresh cluster per repetition, %d kills each (h2 started again on its state dir after each); answers before the success, over all kills: %d × 5002, %d × 5003, %d other errors, %d sockets closed by h1 (then dialled again) (the call is made every 50 ms); all samples, sorted: %s",
		row, o.failovers, codes[wire.CodeOwnerUnreachable], codes[wire.CodeStorageUnavailable], codes[-1], codes[-2], fmtSorted(all))
	rep.note("%s: creating the next session on the restarted h2 was refused (5002/5003) %s times per repetition before it succeeded", row, setupRetries.cell(""))
	return nil
}

// failoverRep is one repetition of rowClusterFailover: the time to each
// failover, and how often the set-up's create on the restarted h2 had to
// be retried.
func failoverRep(cfg config, codes map[int]int) (took []time.Duration, setupRetries int, err error) {
	o := cfg.cluster
	cl, err := startCluster(cfg.bin, tetherOpts{extra: []string{"--cluster-ttl", o.ttl.String()}})
	if err != nil {
		return nil, 0, err
	}
	defer cl.stop()
	defer func() {
		if err != nil {
			err = fmt.Errorf("failover %d: %w; the hosts:%s", len(took), err, cl.state())
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for k := 0; k < o.failovers; k++ {
		victim := cl.hosts[1]
		owner, err := dialHost(ctx, victim, nil)
		if err != nil {
			return nil, 0, fmt.Errorf("dial h2: %w", err)
		}
		// Right after a restart the streams h2's NATS server led may
		// still be changing hands: the create may be refused a while.
		var snap wire.Snapshot
		for t0 := time.Now(); ; {
			snap, err = owner.Create(ctx, wire.CreateParams{Title: fmt.Sprintf("failover-%d", k)})
			if err == nil {
				break
			}
			if !retryable(err) || time.Since(t0) > 30*time.Second {
				owner.Abort()
				return nil, 0, fmt.Errorf("create on h2: %w", err)
			}
			setupRetries++
			time.Sleep(50 * time.Millisecond)
		}
		c, err := dialHost(ctx, cl.hosts[0], nil)
		if err != nil {
			owner.Abort()
			return nil, 0, fmt.Errorf("dial h1: %w", err)
		}
		time.Sleep(200 * time.Millisecond) // a heartbeat or two with the session owned

		if err := syscall.Kill(-victim.pid(), syscall.SIGKILL); err != nil {
			return nil, 0, err
		}
		killed := time.Now()
		var got wire.Snapshot
		for {
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			got, err = c.Resume(cctx, wire.ResumeParams{SessionID: snap.SessionKey})
			ccancel()
			if err == nil {
				break
			}
			var ce *client.CloseError
			switch {
			case retryable(err):
				codes[client.ErrorCode(err)]++
			case client.ErrorCode(err) != 0:
				codes[-1]++ // another error answered: counted, and retried
			case errors.As(err, &ce):
				// h1 relayed the call to the dead owner and closed the
				// socket when it saw the owner gone (1001 "owner host
				// gone; resume"): dial again, as a client would.
				codes[-2]++
				c.Abort()
				if c, err = dialHost(ctx, cl.hosts[0], nil); err != nil {
					return nil, 0, fmt.Errorf("dial h1 again: %w", err)
				}
			default:
				return nil, 0, fmt.Errorf("resume on h1 after the kill: %w", err)
			}
			if time.Since(killed) > o.ttl+60*time.Second {
				return nil, 0, fmt.Errorf("still no resume %v after the kill (ttl %v): %w", time.Since(killed), o.ttl, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		took = append(took, time.Since(killed))
		owner.Abort()
		victim.kill() // reaps it, and a PTY plugin it left
		cl.hosts[1] = nil
		if got.SessionKey != snap.SessionKey || got.Epoch != snap.Epoch {
			c.Abort()
			return nil, 0, fmt.Errorf("resume after the failover gave %s epoch %s, want %s epoch %s", got.SessionKey, got.Epoch, snap.SessionKey, snap.Epoch)
		}
		if _, err := c.CloseSession(ctx, got.SessionID); err != nil {
			c.Abort()
			return nil, 0, err
		}
		c.Abort()
		if err := cl.restart(1); err != nil {
			return nil, 0, err
		}
		// Until h1 sees h2's heartbeat again.
		if err := waitAlive(ctx, cl.hosts[0], 3, 30*time.Second); err != nil {
			return nil, 0, err
		}
		waitQuiet(3 * time.Second)
	}
	return took, setupRetries, nil
}

// waitAlive waits until s reports n alive hosts in cluster.hosts.
func waitAlive(ctx context.Context, s *server, n int, d time.Duration) error {
	c, err := dialHost(ctx, s, nil)
	if err != nil {
		return fmt.Errorf("dial for cluster.hosts: %w", err)
	}
	defer c.Abort()
	deadline := time.Now().Add(d)
	for {
		hs, err := c.ClusterHosts(ctx)
		alive := 0
		for _, h := range hs.Hosts {
			if h.Alive {
				alive++
			}
		}
		if err == nil && alive >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d hosts alive after %v (%+v, %v)", alive, n, d, hs, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fmtSorted(xs []float64) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	var parts []string
	for _, x := range s {
		parts = append(parts, fmt.Sprintf("%.0f", x))
	}
	return strings.Join(parts, " ") + " ms"
}

// clusterPTYScript is the cluster-pty row's PTY: echo off, a ready mark,
// then a line. "PATH" writes that file and exits (a stream, closed with
// 4410 after its last byte); "hold PATH" writes it and then sleeps, so
// that the ring stays full for the reattaches.
const clusterPTYScript = `stty -echo; printf R; read f g; if [ -n "$g" ]; then cat "$g"; exec sleep 3600; fi; exec cat "$f"`

// rowClusterPTY: a PTY on h1 reached through h2 (relayed over NATS)
// against the same PTY reached on h1. Throughput: each stream's PTY is
// started by an attach on h1 (so it lives there), which reads the ready
// mark and leaves; the stream then attaches through h1 or h2 with
// offset 0 and the epoch, so that the replay is exactly the mark, and
// asks for the payload. Reattach: a PTY on h1 that printed 2 × the 1 MiB
// ring and sleeps; dial → last replay byte of a resume at its end offset
// (nothing to replay) and of a resume from the ring's first byte (the
// whole ring), through h1 and through h2 alternately.
func rowClusterPTY(cfg config, rep *report) error {
	o := cfg.cluster
	const ring = 1 << 20
	big, err := makePayload(o.ptySize, 21)
	if err != nil {
		return err
	}
	fill, err := makePayload(2*ring, 22)
	if err != nil {
		return err
	}
	cl, err := startCluster(cfg.bin, tetherOpts{ptyCommand: fmt.Sprintf("sh -c '%s'", clusterPTYScript), extra: []string{"--pty-buffer", sizeName(ring)}})
	if err != nil {
		return err
	}
	defer cl.stop()
	h1, h2 := cl.hosts[0], cl.hosts[1]
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	// startPTY starts a PTY on h1 with a fresh token, waits for its ready
	// mark, types line when not empty, and leaves it running.
	startPTY := func(line string) (string, string, error) {
		tok := randToken()
		p, err := client.AttachPTY(ctx, h1.baseURL(), tok, client.PTYOptions{Options: client.Options{Token: h1.token}, ReadTimeout: 10 * time.Second})
		if err != nil {
			return "", "", err
		}
		defer p.Close()
		var seen []byte
		buf := make([]byte, 4096)
		for !bytes.Contains(seen, []byte("R")) {
			n, err := p.Read(buf)
			if err != nil {
				return "", "", fmt.Errorf("waiting for the PTY's ready mark: %w", err)
			}
			seen = append(seen, buf[:n]...)
		}
		if line != "" {
			if _, err := p.Write([]byte(line)); err != nil {
				return "", "", err
			}
			// Stay until output comes: input sent right before a close
			// may be dropped.
			if _, err := p.Read(buf); err != nil {
				return "", "", err
			}
		}
		return tok, p.Epoch(), nil
	}

	// Throughput, alternating which side goes first.
	stream := func(via *server) (streamResult, string) {
		tok, epoch, err := startPTY("")
		if err != nil {
			return streamResult{}, err.Error()
		}
		r, err := ptyStream(via.wsURL("/api/pty", fmt.Sprintf("attach=%s&offset=0&epoch=%s", tok, epoch)), big)
		switch {
		case err != nil:
			return r, err.Error()
		case !r.ok:
			return r, fmt.Sprintf("got %d of %d bytes, closed %d %q", r.got, big.size, r.code, r.reason)
		}
		return r, ""
	}
	var same, cross, ratio sample
	var fails []string
	completeSame, completeCross := 0, 0
	for i := 0; i < cfg.n; i++ {
		waitQuiet(3 * time.Second)
		order := []*server{h1, h2}
		if i%2 == 1 {
			order = []*server{h2, h1}
		}
		var rs, rc streamResult
		var fs, fc string
		for _, via := range order {
			if via == h1 {
				rs, fs = stream(h1)
			} else {
				rc, fc = stream(h2)
			}
		}
		if fs == "" {
			completeSame++
			same.add(rs.mibps(big.size))
		} else {
			fails = append(fails, fmt.Sprintf("same-host run %d: %s", i, fs))
		}
		if fc == "" {
			completeCross++
			cross.add(rc.mibps(big.size))
		} else {
			fails = append(fails, fmt.Sprintf("cross-host run %d: %s", i, fc))
		}
		if fs == "" && fc == "" {
			ratio.add(rc.mibps(big.size) / rs.mibps(big.size))
		}
		logf(cfg, "cluster-pty stream %d: on h1 %.1f MiB/s %s, through h2 %.1f MiB/s %s", i, rs.mibps(big.size), fs, rc.mibps(big.size), fc)
	}
	row := "cluster-pty stream " + sizeName(big.size)
	rep.add(result{row: row, metric: "throughput through h2 (baseline: on h1)", tether: cross.cell("MiB/s"), baseline: same.cell("MiB/s"), ratio: ratio.cell("×"), n: len(ratio.xs)})
	rep.add(result{row: row, metric: "complete streams through h2 / on h1", tether: fmt.Sprintf("%d/%d", completeCross, cfg.n), baseline: fmt.Sprintf("%d/%d", completeSame, cfg.n),
		target: "all", met: yesNo(completeCross == cfg.n && completeSame == cfg.n), n: cfg.n})
	for _, f := range fails {
		rep.note("%s: %s", row, f)
	}

	// Reattach to a PTY whose ring is full.
	tok, _, err := startPTY("hold " + fill.path + "\n")
	if err != nil {
		return err
	}
	var rf wire.Replay
	for deadline := time.Now().Add(60 * time.Second); ; {
		p, err := client.AttachPTY(ctx, h1.baseURL(), tok, client.PTYOptions{Options: client.Options{Token: h1.token}})
		if err == nil {
			rf = p.Replay()
			p.Abort()
		}
		if err == nil && rf.ReplayEndOffset >= 1+fill.size {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the PTY has not printed %d bytes after 60s: %+v %v", fill.size, rf, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the PTY's output
	}
	end, epoch := rf.ReplayEndOffset, rf.Epoch
	first := end - ring
	var tail50, tail99, ring50, ring99 [2]sample // [0] on h1, [1] through h2
	var tailRatio, ringRatio sample
	for r := 0; r < cfg.n; r++ {
		waitQuiet(2 * time.Second)
		var tl, rl [2][]time.Duration
		for i := 0; i < o.reattach; i++ {
			for j := range 2 {
				side := (i + j) % 2 // alternate which host goes first
				via := cl.hosts[side]
				d, got, err := readResume(ctx, via.wsURL("/api/pty", fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, end, epoch)), end)
				if err != nil {
					return fmt.Errorf("resume at the end through h%d: %w", side+1, err)
				}
				if got.Reset || got.ReplayEndOffset != end {
					return fmt.Errorf("resume at the end through h%d: %+v, want nothing to replay at %d", side+1, got, end)
				}
				tl[side] = append(tl[side], d)
				d, got, err = readResume(ctx, via.wsURL("/api/pty", fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, first, epoch)), first)
				if err != nil {
					return fmt.Errorf("resume of the ring through h%d: %w", side+1, err)
				}
				if got.Reset || got.StartOffset != first || got.ReplayEndOffset-first != ring {
					return fmt.Errorf("resume of the ring through h%d: %+v, want the whole %d-byte ring from %d", side+1, got, ring, first)
				}
				rl[side] = append(rl[side], d)
			}
		}
		for side := range 2 {
			t, g := durationsMS(tl[side]), durationsMS(rl[side])
			tail50[side].add(percentile(t, .5))
			tail99[side].add(percentile(t, .99))
			ring50[side].add(percentile(g, .5))
			ring99[side].add(percentile(g, .99))
		}
		tailRatio.add(percentile(durationsMS(tl[1]), .5) / percentile(durationsMS(tl[0]), .5))
		ringRatio.add(percentile(durationsMS(rl[1]), .5) / percentile(durationsMS(rl[0]), .5))
		logf(cfg, "cluster-pty reattach rep %d: at end p50 h1 %.2fms h2 %.2fms; whole ring p50 h1 %.2fms h2 %.2fms", r,
			percentile(durationsMS(tl[0]), .5), percentile(durationsMS(tl[1]), .5), percentile(durationsMS(rl[0]), .5), percentile(durationsMS(rl[1]), .5))
	}
	row = "cluster-pty reattach, PTY on h1"
	rep.add(result{row: row, metric: "resume at end (0 B), p50 through h2 (baseline: on h1)", tether: tail50[1].cell("ms"), baseline: tail50[0].cell("ms"), ratio: tailRatio.cell("×"), n: cfg.n})
	rep.add(result{row: row, metric: "resume at end (0 B), p99 through h2 (baseline: on h1)", tether: tail99[1].cell("ms"), baseline: tail99[0].cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "resume of the 1MiB ring, p50 through h2 (baseline: on h1)", tether: ring50[1].cell("ms"), baseline: ring50[0].cell("ms"), ratio: ringRatio.cell("×"), n: cfg.n})
	rep.add(result{row: row, metric: "resume of the 1MiB ring, p99 through h2 (baseline: on h1)", tether: ring99[1].cell("ms"), baseline: ring99[0].cell("ms"), n: cfg.n})
	rep.note("%s: %d attaches per host and kind per repetition with offset and epoch, dial → last replay byte (at end: → the pty.replay frame); the PTY printed %s and sleeps (--pty-buffer %s)", row, o.reattach, sizeName(fill.size), sizeName(ring))
	if completeCross != cfg.n || completeSame != cfg.n {
		return fmt.Errorf("%d of %d streams through h2 and %d of %d on h1 were complete", completeCross, cfg.n, completeSame, cfg.n)
	}
	return nil
}

// readResume dials url, a resume from offset from, and reads its replay
// to the last byte: replay_end_offset − from bytes (the header's
// start_offset is the ring's oldest byte, not the cursor).
func readResume(ctx context.Context, url string, from int64) (time.Duration, wire.Replay, error) {
	t0 := time.Now()
	c, err := dial(ctx, url, 256<<10)
	if err != nil {
		return 0, wire.Replay{}, err
	}
	defer c.close()
	_ = c.nc.SetDeadline(time.Now().Add(10 * time.Second))
	var rf wire.Replay
	want, got := int64(-1), int64(0)
	for want < 0 || got < want {
		h, err := c.next()
		if err != nil {
			return 0, rf, fmt.Errorf("after %d replay bytes: %w", got, err)
		}
		if h.OpCode == ws.OpText {
			p, err := io.ReadAll(&c.rd)
			if err != nil {
				return 0, rf, err
			}
			if rf, err = wire.DecodeReplay(p); err != nil {
				return 0, rf, fmt.Errorf("unexpected text frame %q: %w", p, err)
			}
			if rf.Reset || rf.Snapshot {
				return 0, rf, fmt.Errorf("a resume from %d was answered with %+v", from, rf)
			}
			want = rf.ReplayEndOffset - from
			continue
		}
		n, err := io.Copy(io.Discard, &c.rd)
		if err != nil {
			return 0, rf, err
		}
		got += n
	}
	return time.Since(t0), rf, nil
}
