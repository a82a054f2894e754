package e2e_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/testing/wsclient"
	"github.com/tether-agent/tether/wire"
)

// hostConn connects to host h's embedded NATS server the way a host of
// the cluster would (whoever holds the secret is a host): as the user
// tether-host, with the client password the secret derives.
func hostConn(tb testing.TB, h *clusterHost, secretFile string) *nats.Conn {
	tb.Helper()
	b, err := os.ReadFile(secretFile)
	if err != nil {
		tb.Fatal(err)
	}
	m := hmac.New(sha256.New, []byte(strings.TrimSpace(string(b))))
	m.Write([]byte("tether cluster client v1"))
	nc, err := nats.Connect("nats://"+h.Client, nats.UserInfo("tether-host", hex.EncodeToString(m.Sum(nil))),
		nats.IgnoreDiscoveredServers(), nats.NoReconnect(), nats.Timeout(5*time.Second))
	if err != nil {
		tb.Fatalf("connect to %s's NATS server as a host: %v", h.ID, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// leadEverything makes h's NATS server the leader of every stream of the
// cluster (the buckets are streams too), asking each leader elsewhere to
// step down in h's favour, and waits until it is. Killing h then leaves
// every stream without a leader until the two others elect one: what a
// client of a killed host meets at its worst.
func leadEverything(tb testing.TB, h *clusterHost, secretFile string) []string {
	tb.Helper()
	nc := hostConn(tb, h, secretFile)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	var names []string
	lister := js.StreamNames(ctxT(tb, 10*time.Second))
	for n := range lister.Name() {
		names = append(names, n)
	}
	if err := lister.Err(); err != nil || len(names) < 5 {
		tb.Fatalf("streams of the cluster: %v %v, want the buckets and streams of tether", names, err)
	}
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": h.ID}})
	deadline := time.Now().Add(30 * time.Second)
	for _, name := range names {
		for {
			st, err := js.Stream(ctxT(tb, 5*time.Second), name)
			if err == nil && st.CachedInfo().Cluster != nil && st.CachedInfo().Cluster.Leader == h.ID {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("stream %s: %s's server does not become its leader (%v)", name, h.ID, err)
			}
			// Refused while an election is running: asked again.
			_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+name, req, 5*time.Second)
			time.Sleep(100 * time.Millisecond) // polling the new leader
		}
	}
	return names
}

// TestClusterOwnerKilledAnswers5002: kill -9 of the host owning a
// session, whose NATS server led every stream and bucket of the cluster
// (the worst case: nothing of the cluster answers until the two servers
// left elect new leaders). A resume on another host, tried again and
// again, is answered 5002 "owner unreachable; retry" each time, and
// promptly (within 3 s: never a 5003 after a store read waited out its
// timeout, never a 5000), until the owner's heartbeat is a TTL old and
// the leaders are elected; then it gets the session with its history.
func TestClusterOwnerKilledAnswers5002(t *testing.T) {
	const ttl = 3 * time.Second
	const bound = 3 * time.Second
	secret := clusterSecret(t)
	hosts := startClusterOf(t, 3, secret, nil, "--cluster-ttl", ttl.String())
	owner := hosts[0].Dial(t)
	var created snapshot
	call(t, owner, "session.create", map[string]any{"title": "killed owner"}, &created)
	call(t, owner, "prompt.submit", map[string]any{"session_id": created.SessionID, "text": "said before the kill"}, nil)
	waitComplete(t, owner, created.SessionID)
	streams := leadEverything(t, hosts[0], secret)
	t.Logf("h1 leads %v", streams)

	if err := hosts[0].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	c := hosts[1].Dial(t)
	var snap snapshot
	var answers []string
	for {
		began := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := c.Call(ctx, "session.resume", map[string]any{"session_id": created.SessionKey}, &snap)
		cancel()
		took := time.Since(began)
		if err == nil {
			break
		}
		answers = append(answers, err.Error())
		if code := wsclient.ErrorCode(err); code != wire.CodeOwnerUnreachable || !strings.Contains(err.Error(), "owner unreachable; retry") {
			t.Fatalf("resume %v after the kill: %v (after %v), want 5002 \"owner unreachable; retry\"", time.Since(killed).Round(time.Millisecond), err, took)
		}
		if took > bound {
			t.Fatalf("resume %v after the kill answered 5002 after %v, want within %v: %v", time.Since(killed).Round(time.Millisecond), took, bound, err)
		}
		if time.Since(killed) > ttl+30*time.Second {
			t.Fatalf("still 5002 %v after the kill (ttl %v): %v", time.Since(killed), ttl, err)
		}
		time.Sleep(200 * time.Millisecond) // the client's retry backoff
	}
	took := time.Since(killed)
	t.Logf("resumed on h2 %v after kill -9 of h1 (ttl %v), after %d answers 5002", took.Round(time.Millisecond), ttl, len(answers))
	for i, a := range answers {
		t.Logf("answer %d: %s", i, a)
	}
	if took < ttl {
		t.Errorf("resumed %v after the kill, before the owner's heartbeat was a TTL (%v) old", took, ttl)
	}
	if len(answers) == 0 {
		t.Errorf("resumed with no 5002 first: the owner's heartbeat cannot have been a TTL old")
	}
	if snap.SessionKey != created.SessionKey || snap.Epoch != created.Epoch {
		t.Errorf("resumed %s epoch %s, want %s epoch %s", snap.SessionKey, snap.Epoch, created.SessionKey, created.Epoch)
	}
	if len(snap.Messages) != 2 || snap.Messages[0].Text != "said before the kill" || snap.Messages[1].Text != "said before the kill" {
		t.Errorf("messages %+v, want the prompt and its echo", snap.Messages)
	}

	// Meanwhile h2's NATS server tried the route to h1's again and again,
	// several times a second: said once as a warning (perhaps once more,
	// if h1's route was not up yet when h2 started), the rest at debug.
	loud, quiet := routeRetries(t, hosts[1], hosts[0].Route)
	t.Logf("h2 logged the route to h1 failing %d times above debug, %d at debug", loud, quiet)
	if loud < 1 || loud > 2 || quiet < 5 {
		t.Errorf("h2 logged the route to h1 failing %d times above debug and %d at debug, want once or twice and the rest (at least 5) at debug", loud, quiet)
	}
}

// routeRetries counts the lines in h's log of its NATS server failing to
// connect the route to addr: above debug level, and at debug level.
func routeRetries(tb testing.TB, h *clusterHost, addr string) (loud, quiet int) {
	tb.Helper()
	for _, line := range strings.Split(h.Stderr.String(), "\n") {
		var e struct{ Level, Message string }
		if json.Unmarshal([]byte(line), &e) != nil || !strings.HasPrefix(e.Message, "Error trying to connect to route") || !strings.Contains(e.Message, addr) {
			continue
		}
		if e.Level == "debug" {
			quiet++
		} else {
			loud++
		}
	}
	return loud, quiet
}
