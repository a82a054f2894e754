package e2e_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/hostproc"
	"github.com/tether-agent/tether/testing/ptyclient"
	"github.com/tether-agent/tether/testing/wsclient"
	"github.com/tether-agent/tether/wire"
)

// goTB is a testing.TB for a goroutine that is not the test's: Fatal
// reports the failure on the test and ends only the goroutine.
type goTB struct{ testing.TB }

func (g goTB) Fatalf(format string, args ...any) {
	g.Helper()
	g.Errorf(format, args...)
	runtime.Goexit()
}

func (g goTB) Fatal(args ...any) {
	g.Helper()
	g.Error(args...)
	runtime.Goexit()
}

// freeAddrs returns n loopback addresses whose ports were free a moment
// ago (hostproc.FreeAddrs): the embedded NATS servers of a cluster must
// know each other's route addresses before they start.
func freeAddrs(tb testing.TB, n int) []string {
	tb.Helper()
	addrs, err := hostproc.FreeAddrs(n)
	if err != nil {
		tb.Fatal(err)
	}
	return addrs
}

// clusterHost is one host of a test cluster: the server and its NATS
// addresses.
type clusterHost struct {
	*e2e.Server
	ID     string
	Client string   // its embedded NATS server's client address
	Route  string   // its embedded NATS server's route address
	Args   []string // its tether serve flags, to start it again
}

// restart starts the host again on its state dir with its flags (after a
// kill): its embedded NATS server rejoins the cluster with its files.
func (h *clusterHost) restart(t *testing.T) {
	t.Helper()
	h.Server = e2e.Start(t, e2e.Config{Args: h.Args, StateDir: h.StateDir})
}

// clusterSecret makes a cluster secret the way docs/CLUSTER.md says, with
// `tether cluster secret` into a file of mode 0600, and returns its path.
func clusterSecret(tb testing.TB) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "cluster-secret")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(e2e.Build(tb), "cluster", "secret")
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = f, &stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("tether cluster secret: %v %s", err, stderr.String())
	}
	return path
}

// startCluster3 starts three real hosts, each running an embedded NATS
// server routed with the two others (--cluster embedded) with one
// cluster secret, the way docs/CLUSTER.md's three-host setup does, and waits
// until all serve.
func startCluster3(t *testing.T, args ...string) []*clusterHost {
	t.Helper()
	return startClusterOf(t, 3, clusterSecret(t), nil, args...)
}

// startClusterOf starts n hosts like startCluster3 with secret as their
// --cluster-secret-file, host i's flags being args and hostArgs(i) (when
// hostArgs is not nil).
func startClusterOf(t *testing.T, n int, secret string, hostArgs func(i int) []string, args ...string) []*clusterHost {
	t.Helper()
	clients, routes := freeAddrs(t, n), freeAddrs(t, n)
	routeURLs := make([]string, n)
	for i, r := range routes {
		routeURLs[i] = "nats-route://" + r
	}
	hosts := make([]*clusterHost, n)
	var wg sync.WaitGroup
	for i := range hosts {
		id := fmt.Sprintf("h%d", i+1)
		hargs := append([]string{
			"--cluster", "embedded",
			"--cluster-secret-file", secret,
			"--cluster-listen", clients[i],
			"--cluster-route-listen", routes[i],
			"--cluster-routes", strings.Join(routeURLs, ","),
			"--host-id", id,
			"--pty-command", "",
		}, args...)
		if hostArgs != nil {
			hargs = append(hargs, hostArgs(i)...)
		}
		wg.Go(func() {
			s := e2e.Start(goTB{t}, e2e.Config{Args: hargs})
			hosts[i] = &clusterHost{Server: s, ID: id, Client: clients[i], Route: routes[i], Args: hargs}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return hosts
}

// clusterHostsOf asks host h for the cluster's hosts.
func clusterHostsOf(tb testing.TB, c *wsclient.Client) wire.ClusterHosts {
	tb.Helper()
	var res wire.ClusterHosts
	call(tb, c, wire.MethodClusterHosts, nil, &res)
	return res
}

// eventLog collects the events of one session a client receives.
func eventLog(tb testing.TB, c *wsclient.Client, sid string, until func(wsclient.Event) bool) []string {
	tb.Helper()
	var out []string
	for {
		ev, err := c.NextEvent(ctxT(tb, 15*time.Second))
		if err != nil {
			tb.Fatalf("events of %s: %v (so far %v)", sid, err, out)
		}
		if ev.SessionID != sid {
			continue
		}
		out = append(out, fmt.Sprintf("%d %s %s", ev.Seq, ev.Type, ev.Payload))
		if until(ev) {
			return out
		}
	}
}

// TestClusterResumeAcrossHosts: a session created on h1 and resumed on
// h2 is one live session with one runtime id and its whole history;
// viewers on h1 and h2 receive the same events in seq order; the stale
// disconnect of h1's socket leaves it live for h2's; active_list is
// cluster-wide; cluster.hosts lists the three hosts.
func TestClusterResumeAcrossHosts(t *testing.T) {
	hosts := startCluster3(t, "--echo-delay", "20ms", "--orphan-grace", "0", "--admin-listen", "127.0.0.1:0")
	a := hosts[0].Dial(t)
	var created snapshot
	call(t, a, "session.create", map[string]any{"title": "across"}, &created)
	call(t, a, "prompt.submit", map[string]any{"session_id": created.SessionID, "text": "first turn here"}, nil)
	waitComplete(t, a, created.SessionID)

	b := hosts[1].Dial(t)
	var resumed snapshot
	call(t, b, "session.resume", map[string]any{"session_id": created.SessionKey}, &resumed)
	if resumed.SessionID != created.SessionID || resumed.Epoch != created.Epoch {
		t.Fatalf("resume on h2: session %s epoch %s, want the live %s epoch %s", resumed.SessionID, resumed.Epoch, created.SessionID, created.Epoch)
	}
	if len(resumed.Messages) != 2 || resumed.Messages[1].Text != "first turn here" {
		t.Fatalf("resume on h2: messages %+v, want the first turn", resumed.Messages)
	}

	// A prompt from h2: both viewers see the same events, in seq order.
	call(t, b, "prompt.submit", map[string]any{"session_id": resumed.SessionID, "text": "one two three four"}, nil)
	done := func(e wsclient.Event) bool { return e.Type == "message.complete" }
	var onA, onB []string
	var wg sync.WaitGroup
	wg.Go(func() { onA = eventLog(goTB{t}, a, created.SessionID, done) })
	wg.Go(func() { onB = eventLog(goTB{t}, b, created.SessionID, done) })
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if !slices.Equal(onA, onB) {
		t.Fatalf("viewers differ:\nh1: %v\nh2: %v", onA, onB)
	}
	for i := 1; i < len(onA); i++ {
		var p, q uint64
		fmt.Sscan(onA[i-1], &p)
		fmt.Sscan(onA[i], &q)
		if q != p+1 {
			t.Fatalf("seq %d after %d: %v", q, p, onA)
		}
	}

	// Cluster-wide active_list, from the third host.
	c := hosts[2].Dial(t)
	live := liveForKey(activeList(t, c), created.SessionKey)
	if len(live) != 1 || live[0].ID != created.SessionID || live[0].Viewers != 2 {
		t.Fatalf("active_list on h3: %+v, want one session %s with 2 viewers", live, created.SessionID)
	}

	// Per-host metrics: h2's client is relayed to h1.
	for _, m := range []struct {
		h      *clusterHost
		name   string
		labels []string
		want   float64
	}{
		{hosts[0], "tether_cluster_host", []string{"host_id=h1"}, 1},
		{hosts[0], "tether_cluster_hosts", []string{"state=alive"}, 3},
		{hosts[0], "tether_cluster_relay_legs", []string{"direction=in"}, 1},
		{hosts[1], "tether_cluster_relay_legs", []string{"direction=out"}, 1},
		{hosts[1], "tether_live_sessions", nil, 0},
		{hosts[0], "tether_live_sessions", nil, 1},
		{hosts[0], "tether_viewers", nil, 2},
	} {
		if got := m.h.Metric(t, m.name, m.labels...); got != m.want {
			t.Errorf("%s: %s%v = %v, want %v", m.h.ID, m.name, m.labels, got, m.want)
		}
	}

	// The stale disconnect: h1's socket drops; h2's viewer keeps it live.
	_ = a.Drop()
	call(t, b, "prompt.submit", map[string]any{"session_id": resumed.SessionID, "text": "still live"}, nil)
	if text, status := waitComplete(t, b, resumed.SessionID); text != "still live" || status != "complete" {
		t.Fatalf("after h1's viewer left: %q %q", text, status)
	}
	live = liveForKey(activeList(t, c), created.SessionKey)
	if len(live) != 1 || live[0].Viewers != 1 {
		t.Fatalf("active_list after h1's drop: %+v, want one session with 1 viewer", live)
	}

	// Resume by title and session.list are cluster-wide too.
	var byTitle snapshot
	call(t, c, "session.resume", map[string]any{"session_id": "across"}, &byTitle)
	if byTitle.SessionID != created.SessionID {
		t.Fatalf("resume by title on h3: session %s, want the live %s", byTitle.SessionID, created.SessionID)
	}
	var listed struct {
		Sessions []struct {
			ID string `json:"id"`
		} `json:"sessions"`
	}
	call(t, hosts[2].Dial(t), "session.list", nil, &listed)
	if len(listed.Sessions) != 1 || listed.Sessions[0].ID != created.SessionKey {
		t.Fatalf("session.list on h3: %+v, want the session made on h1", listed.Sessions)
	}

	// tether cluster, the command, through h2 with its token file.
	out, errOut, code := runCLI(t, "", "cluster", "--json", "--url", hosts[1].URL, "--state-dir", hosts[1].StateDir)
	var cli wire.ClusterHosts
	if code != 0 || json.Unmarshal([]byte(out), &cli) != nil || len(cli.Hosts) != 3 || cli.Hosts[0].ID != "h2" || !cli.Hosts[0].Self {
		t.Errorf("tether cluster --json: exit %d, stdout %q, stderr %q; want h2 (self) and two more", code, out, errOut)
	}
	out, _, code = runCLI(t, "", "cluster", "--url", hosts[0].URL, "--state-dir", hosts[0].StateDir)
	if code != 0 || !strings.HasPrefix(out, "HOST") || !strings.Contains(out, "h1 (this)") || !strings.Contains(out, "h2") || !strings.Contains(out, "h3") {
		t.Errorf("tether cluster: exit %d, stdout %q", code, out)
	}

	hs := clusterHostsOf(t, c)
	var ids []string
	for _, h := range hs.Hosts {
		if !h.Alive {
			t.Errorf("host %s not alive: %+v", h.ID, h)
		}
		ids = append(ids, h.ID)
	}
	if !hs.Cluster || !slices.Equal(ids, []string{"h3", "h1", "h2"}) || !hs.Hosts[0].Self {
		t.Errorf("cluster.hosts on h3: %+v, want h3 (self), h1, h2", hs)
	}
}

// TestClusterResumeStorm: 66 sockets spread over three hosts resume one
// stored key at once: one runtime id, one live session cluster-wide.
func TestClusterResumeStorm(t *testing.T) {
	hosts := startCluster3(t)
	c := hosts[0].Dial(t)
	var created snapshot
	call(t, c, "session.create", map[string]any{"title": "storm"}, &created)
	call(t, c, "prompt.submit", map[string]any{"session_id": created.SessionID, "text": "before the storm"}, nil)
	waitComplete(t, c, created.SessionID)
	call(t, c, "session.close", map[string]any{"session_id": created.SessionID}, nil)

	const n = 66
	clients := make([]*wsclient.Client, n)
	for i := range clients {
		clients[i] = hosts[i%3].Dial(t)
	}
	ids := make([]string, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Go(func() {
			<-start
			var snap snapshot
			// A resume may meet the key claimed by a host that is still
			// building it: 5002 says retry.
			for try := 0; ; try++ {
				err := cl.Call(ctxT(t, 20*time.Second), "session.resume", map[string]any{"session_id": created.SessionKey}, &snap)
				if err == nil {
					break
				}
				if wsclient.ErrorCode(err) != wire.CodeOwnerUnreachable || try == 50 {
					t.Errorf("resume %d on h%d: %v", i, i%3+1, err)
					return
				}
				time.Sleep(20 * time.Millisecond) // the client's retry backoff
			}
			if len(snap.Messages) != 2 {
				t.Errorf("resume %d: messages %+v, want the stored turn", i, snap.Messages)
			}
			ids[i] = snap.SessionID
		})
	}
	close(start)
	wg.Wait()
	for i, id := range ids {
		if id != ids[0] {
			t.Fatalf("resume %d (h%d) got session %s, want %s like resume 0", i, i%3+1, id, ids[0])
		}
	}
	for _, h := range hosts {
		live := liveForKey(activeList(t, h.Dial(t)), created.SessionKey)
		if len(live) != 1 || live[0].Viewers != n {
			t.Fatalf("active_list on %s: %+v, want one session with %d viewers", h.ID, live, n)
		}
	}
}

// TestClusterHostKilled: kill -9 of the host owning a session with a run
// in flight (its embedded NATS server, one of three, goes with it): a
// resume elsewhere answers 5002 until the TTL has passed, then rebuilds
// the session with its whole history, the same epoch, seq continuing, and
// the interrupted run completed from its journaled deltas.
func TestClusterHostKilled(t *testing.T) {
	const ttl = 2 * time.Second
	hosts := startCluster3(t, "--cluster-ttl", ttl.String(), "--echo-delay", "200ms")
	owner := hosts[1].Dial(t)
	var created snapshot
	call(t, owner, "session.create", map[string]any{"title": "doomed"}, &created)
	call(t, owner, "prompt.submit", map[string]any{"session_id": created.SessionID, "text": "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20"}, nil)
	var lastSeq uint64
	for n := 0; n < 3; {
		ev, err := owner.NextEvent(ctxT(t, 15*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == "message.delta" {
			n++
			lastSeq = ev.Seq
		}
	}
	// A viewer through h3, relayed to h2.
	relayed := hosts[2].Dial(t)
	call(t, relayed, "session.resume", map[string]any{"session_id": created.SessionKey}, nil)
	if err := hosts[1].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case <-relayed.Closed():
	case <-time.After(ttl + 15*time.Second):
		t.Fatal("the socket relayed to the killed host was not closed")
	}
	if code, reason := relayed.CloseCode(); code != 1001 || reason != "owner host gone; resume" {
		t.Errorf("relayed socket closed %d %q, want 1001 \"owner host gone; resume\"", code, reason)
	}

	c := hosts[0].Dial(t)
	var snap snapshot
	saw5002 := false
	for {
		err := c.Call(ctxT(t, 10*time.Second), "session.resume", map[string]any{"session_id": created.SessionKey}, &snap)
		if err == nil {
			break
		}
		// The NATS server that went with h2 led some of the cluster's
		// streams: until they have new leaders, a resume answers 5002 too.
		if wsclient.ErrorCode(err) != wire.CodeOwnerUnreachable {
			t.Fatalf("resume after the kill: %v, want 5002 or success", err)
		}
		saw5002 = true
		if time.Since(killed) > ttl+15*time.Second {
			t.Fatalf("still 5002 %v after the kill (ttl %v)", time.Since(killed), ttl)
		}
		time.Sleep(100 * time.Millisecond) // the client's retry backoff
	}
	took := time.Since(killed)
	t.Logf("resumable on h1 %v after kill -9 of h2 (ttl %v)", took, ttl)
	if !saw5002 && took < ttl/2 {
		t.Errorf("resumed %v after the kill with no 5002: the owner's heartbeat cannot have expired", took)
	}
	if snap.Epoch != created.Epoch {
		t.Errorf("epoch %s after failover, want %s", snap.Epoch, created.Epoch)
	}
	if snap.LatestSeq <= lastSeq {
		t.Errorf("latest_seq %d, want past %d", snap.LatestSeq, lastSeq)
	}
	if len(snap.Messages) != 2 || !strings.HasPrefix(snap.Messages[1].Text, "w1 w2 w3") {
		t.Fatalf("messages %+v, want the prompt and the interrupted answer rebuilt from its deltas", snap.Messages)
	}
	// The journal has every event, the interrupted completion last.
	var since struct {
		Events []json.RawMessage `json:"events"`
	}
	call(t, c, "session.events.since", map[string]any{"session_id": snap.SessionID, "last_seen": 0}, &since)
	if len(since.Events) == 0 || !strings.Contains(string(since.Events[len(since.Events)-1]), `"interrupted"`) {
		t.Fatalf("journal after failover ends with %s, want message.complete interrupted", since.Events[len(since.Events)-1:])
	}
}

// TestClusterSIGTERMHandsBack: a host stopped with SIGTERM hands its
// sessions back at once: another host resumes them with no 5002 wait.
func TestClusterSIGTERMHandsBack(t *testing.T) {
	hosts := startCluster3(t, "--cluster-ttl", "30s")
	owner := hosts[2].Dial(t)
	var created snapshot
	call(t, owner, "session.create", map[string]any{"title": "handed back"}, &created)
	relayed := hosts[1].Dial(t) // a viewer through h2, relayed to h3
	call(t, relayed, "session.resume", map[string]any{"session_id": created.SessionKey}, nil)
	if err := hosts[2].Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-relayed.Closed():
	case <-time.After(10 * time.Second):
		t.Fatal("the socket relayed to the stopping host was not closed")
	}
	if code, reason := relayed.CloseCode(); code != 1001 {
		t.Errorf("relayed socket closed %d %q, want 1001 (the owner's shutdown)", code, reason)
	}
	if code, err := hosts[2].Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("h3 exit %d %v", code, err)
	}
	stopped := time.Now()
	c := hosts[0].Dial(t)
	var snap snapshot
	// The NATS server that left with h3 led some of the cluster's streams:
	// until the others lead them, a resume answers 5002 (retry).
	for {
		err := c.Call(ctxT(t, 10*time.Second), "session.resume", map[string]any{"session_id": created.SessionKey}, &snap)
		if err == nil {
			break
		}
		if code := wsclient.ErrorCode(err); code != wire.CodeOwnerUnreachable {
			t.Fatalf("resume after h3's stop: %v, want 5002 or success", err)
		}
		if time.Since(stopped) > 10*time.Second {
			t.Fatalf("resume after h3's stop still refused after %v (ttl 30s): %v", time.Since(stopped), err)
		}
		time.Sleep(100 * time.Millisecond) // the client's retry backoff
	}
	t.Logf("resumed on h1 %v after h3 stopped (ttl 30s)", time.Since(stopped))
	if snap.SessionKey != created.SessionKey || snap.Epoch != created.Epoch {
		t.Fatalf("resume after h3's stop: %+v", snap)
	}
}

// TestClusterPTYAcrossHosts: a PTY started through h1 is reached from
// every host with exact offsets (the counter stream hops h1 → h2 → h3 → …
// with no gap and no repeat, and no reset); a writer on h3 supersedes
// one on h2 (4409); the PTY's exit closes sockets on every host with 4410
// after the last bytes; the PTY stays on h1 throughout.
func TestClusterPTYAcrossHosts(t *testing.T) {
	hosts := startCluster3(t, "--pty-command", counter)
	tok := attachToken(t)
	var stream []byte
	c := ptyDial(t, hosts[0].Server, "attach="+tok)
	r := replayOf(t, c)
	if !r.Reset || r.Reason != "initial" {
		t.Fatalf("first attach %+v, want reset initial", r)
	}
	epoch := r.Epoch
	var offset int64
	for round := range 9 {
		target := lastNumber(stream) + 5
		if err := c.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return lastNumber(append(stream[:len(stream):len(stream)], b...)) >= target }); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		c.Drop()
		got := c.Output()
		stream = append(stream, got...)
		offset += int64(len(got))
		h := hosts[(round+1)%3]
		c = ptyDial(t, h.Server, fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, offset, epoch))
		r = replayOf(t, c)
		if r.Reset || r.Reason != "resume" || r.Epoch != epoch {
			t.Fatalf("round %d: reattach through %s at %d got %+v, want resume without reset", round, h.ID, offset, r)
		}
	}
	c.Drop()
	stream = append(stream, c.Output()...)
	lines := strings.Split(string(stream), "\r\n")
	for i, line := range lines[:len(lines)-1] {
		if want := fmt.Sprintf("n%d", i+1); line != want {
			t.Fatalf("line %d is %q, want %q", i, line, want)
		}
	}

	// Supersede across hosts, and the PTY's host is h1 alone.
	w2 := ptyDial(t, hosts[1].Server, "attach="+tok)
	replayOf(t, w2)
	w3 := ptyDial(t, hosts[2].Server, "attach="+tok)
	replayOf(t, w3)
	if code := closeCode(t, w2); code != 4409 {
		t.Fatalf("writer on h2 superseded from h3 closed with %d, want 4409", code)
	}
	for i, h := range hosts {
		ptys := clusterHostsOf(t, h.Dial(t))
		for _, row := range ptys.Hosts {
			if row.ID == h.ID && (row.PTYs == 1) != (i == 0) {
				t.Errorf("%s reports %d PTYs in the heartbeat, want the PTY on h1 only", h.ID, row.PTYs)
			}
		}
	}
}

// TestClusterPTYExit: the exit of a PTY on h1 closes its sockets on h2
// and h3 with 4410 after every byte it wrote.
func TestClusterPTYExit(t *testing.T) {
	hosts := startCluster3(t, "--pty-command", `sh -c 'read x; seq 1 20000; exit 3'`)
	tok := attachToken(t)
	w := ptyDial(t, hosts[0].Server, "attach="+tok)
	replayOf(t, w)
	v2 := ptyDial(t, hosts[1].Server, "view=1&attach="+tok)
	r2 := replayOf(t, v2)
	v3 := ptyDial(t, hosts[2].Server, "view=1&attach="+tok)
	r3 := replayOf(t, v3)
	if r2.Epoch != r3.Epoch || r2.Epoch == "" {
		t.Fatalf("viewers on h2 and h3 see epochs %q and %q, want the one PTY's", r2.Epoch, r3.Epoch)
	}
	if err := w.Write([]byte("\r")); err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := 1; i <= 20000; i++ {
		fmt.Fprintf(&want, "%d\r\n", i)
	}
	for name, c := range map[string]*ptyclient.Client{"h1": w, "h2": v2, "h3": v3} {
		if code := closeCode(t, c); code != 4410 {
			t.Errorf("%s: close code %d, want 4410", name, code)
		}
		if out := string(c.Output()); !strings.HasSuffix(out, want.String()) {
			t.Errorf("%s: output (%d bytes) does not end with all 20000 lines", name, len(out))
		}
	}
}

// TestClusterCommandAlone: tether cluster against a host with no
// --cluster says so, exit 0; --json says cluster false with the host.
func TestClusterCommandAlone(t *testing.T) {
	s := e2e.Start(t, e2e.Config{})
	out, errOut, code := runCLI(t, "", "cluster", "--url", s.URL, "--state-dir", s.StateDir)
	if code != 0 || !strings.Contains(out, "not in a cluster") {
		t.Errorf("tether cluster: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, _, code = runCLI(t, "", "cluster", "--json", "--url", s.URL, "--state-dir", s.StateDir)
	var hs wire.ClusterHosts
	if code != 0 || json.Unmarshal([]byte(out), &hs) != nil || hs.Cluster || len(hs.Hosts) != 1 || !hs.Hosts[0].Self {
		t.Errorf("tether cluster --json: exit %d, stdout %q", code, out)
	}
}

// TestClusterStopWithoutQuorumEndsInTime: a host whose two peers died
// (kill -9) has no quorum left: none of its stop's writes (persisting the
// session, giving back its ownership, leaving the registry) can succeed,
// and each would wait out its own timeout. SIGTERM must still end it
// within the host's one stop deadline (4 s, and half a second for a part
// that ignores it), with exit status 0; the log names the part that
// overran it.
func TestClusterStopWithoutQuorumEndsInTime(t *testing.T) {
	hosts := startCluster3(t)
	owner := hosts[2].Dial(t)
	var created snapshot
	call(t, owner, "session.create", map[string]any{"title": "no quorum at the stop"}, &created)
	call(t, owner, "prompt.submit", map[string]any{"session_id": created.SessionID, "text": "a turn in flight when the peers die"}, nil)
	for _, h := range hosts[:2] {
		if err := h.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_, _ = h.Wait(10 * time.Second) // killed: the error names the signal
	}
	sent := time.Now()
	if err := hosts[2].Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := hosts[2].Wait(9500 * time.Millisecond)
	took := time.Since(sent)
	if err != nil || code != 0 {
		t.Fatalf("h3 after SIGTERM with no quorum: exit %d %v after %v, want 0 within the stop deadline", code, err, took)
	}
	cut := strings.Contains(hosts[2].Stderr.String(), "overran the shutdown deadline")
	if took >= 4*time.Second && !cut {
		t.Errorf("h3 took %v to stop and did not say which part overran the deadline", took)
	}
	t.Logf("h3 stopped %v after SIGTERM with no quorum (deadline cut it: %v)", took, cut)
}
