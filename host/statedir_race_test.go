package host

import (
	"context"
	"errors"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/testing/e2e"
)

// lockedBuffer is an io.Writer safe for the host's writes and the
// test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestTwoHostsForcedInterleaving forces the interleaving the race of two
// hosts on one state dir can take: host A is held right after it took
// the state dir's lock, before anything else of its start-up; host B,
// started on the same dir then, fails at once with ErrStateDirInUse
// naming A's pid; released, A goes on to serve.
func TestTwoHostsForcedInterleaving(t *testing.T) {
	bin := e2e.Build(t) // the real ws transport plugin
	dir := t.TempDir()
	paused := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	afterLock = func() {
		once.Do(func() {
			close(paused)
			<-release
		})
	}
	t.Cleanup(func() { afterLock = nil })
	cfg := func(stdout *lockedBuffer) Config {
		return Config{
			Listen:    "127.0.0.1:0",
			Token:     "forced-interleaving-token",
			StateDir:  dir,
			Agents:    agent.NewEchoFactory(0),
			Transport: PluginSpec{Name: "ws", Path: bin, Args: []string{"plugin", "ws"}},
			Stdout:    stdout,
			Log:       zerolog.Nop(),
		}
	}

	var outA lockedBuffer
	ctxA, stopA := context.WithCancel(context.Background())
	defer stopA()
	doneA := make(chan error, 1)
	go func() { doneA <- Run(ctxA, cfg(&outA)) }()
	select {
	case <-paused:
	case err := <-doneA:
		t.Fatalf("host A ended before taking the lock: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("host A did not take the state dir's lock within 10s")
	}

	// B, on the same dir while A holds the lock and has done nothing
	// else: it fails at once, naming A's pid (this process's).
	var outB lockedBuffer
	begin := time.Now()
	errB := Run(context.Background(), cfg(&outB))
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("host B took %v to fail; want it to fail at once", took)
	}
	if !errors.Is(errB, ErrStateDirInUse) {
		t.Fatalf("host B: %v, want ErrStateDirInUse", errB)
	}
	if want := "is in use by pid " + strconv.Itoa(os.Getpid()); !strings.Contains(errB.Error(), want) {
		t.Errorf("host B: %q does not say %q", errB, want)
	}
	if outB.String() != "" {
		t.Errorf("host B printed %q; want nothing", outB.String())
	}

	// Released, A serves.
	close(release)
	re := regexp.MustCompile(`tether listening on (http://\S+)/\?token=`)
	var url string
	for deadline := time.Now().Add(30 * time.Second); ; {
		if m := re.FindStringSubmatch(outA.String()); m != nil {
			url = m[1]
			break
		}
		select {
		case err := <-doneA:
			t.Fatalf("host A ended instead of serving: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("host A did not serve within 30s after release; printed %q", outA.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := cl.Get(url + "/healthz")
	if err != nil {
		t.Fatalf("host A's /healthz: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("host A's /healthz: %s, want 200", resp.Status)
	}
	if pid, err := LockHolder(dir); err != nil || pid != os.Getpid() {
		t.Errorf("LockHolder = %d, %v; want host A, %d", pid, err, os.Getpid())
	}
	stopA()
	select {
	case err := <-doneA:
		if err != nil {
			t.Errorf("host A: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("host A did not stop within 10s")
	}
}
