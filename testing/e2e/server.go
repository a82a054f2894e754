package e2e

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/hostproc"
	"github.com/tether-agent/tether/testing/wsclient"
)

// Timeouts of the harness.
const (
	startTimeout = 30 * time.Second // for the listening (and admin) line
	stopTimeout  = 10 * time.Second // from SIGTERM to exit, then SIGKILL
	ptyGrace     = 5 * time.Second  // for a PTY plugin left behind, then SIGKILL
	dialTimeout  = 10 * time.Second // Dial and its gateway.ready
	httpTimeout  = 10 * time.Second
	tailLines    = 200 // stderr lines printed when a test fails
)

// Config configures Start.
type Config struct {
	// Args are extra flags after the harness's own; a flag given again here
	// wins (e.g. "--listen", "127.0.0.1:PORT" to restart on the same port).
	Args []string
	// StateDir is the --state-dir; "" means a new tb.TempDir(). Pass a
	// previous Server's StateDir to restart a host on the same state.
	StateDir string
	// Env holds extra KEY=VALUE environment variables for the child.
	Env []string
	// Binary is the tether binary to run; "" means the one Build makes.
	Binary string
}

// Server is a running `tether serve` child process. The exported fields are
// set by Start and not changed afterwards.
type Server struct {
	URL      string // http://host:port of the public listener
	Token    string // the access token from the listening line
	Addr     string // host:port of the public listener
	StateDir string
	AdminURL string // http://host:port of --admin-listen, "" without it
	Cmd      *exec.Cmd
	Stderr   *Buffer // everything the child wrote to stderr so far

	proc *hostproc.Process
}

// Start launches `tether serve --listen 127.0.0.1:0 --state-dir DIR
// --log-format json --log-level debug <cfg.Args...>` through
// testing/hostproc and returns once it has printed its listening line
// (and, when --admin-listen is given, its admin line). It fails the test,
// with the tail of stderr, if that takes more than 30 s or the child exits
// first. The child's stdout and stderr are drained all along. At cleanup
// the child gets SIGTERM (SIGKILL 10 s later, which fails the test);
// leftovers are killed: processes of its process group, and a PTY plugin
// left running on the state directory. When the test has failed, the tail
// of the child's stderr is logged.
func Start(tb testing.TB, cfg Config) *Server {
	tb.Helper()
	bin := cfg.Binary
	if bin == "" {
		bin = Build(tb)
	}
	dir := cfg.StateDir
	if dir == "" {
		dir = tb.TempDir()
	}
	// Cleanups run last-in first-out: the PTY plugin goes after the host.
	tb.Cleanup(func() { killPTYPlugin(tb, dir, bin) })
	stderr := new(Buffer)
	p, err := hostproc.Start(hostproc.Config{
		Binary:   bin,
		StateDir: dir,
		Args: append([]string{
			"--listen", "127.0.0.1:0",
			"--log-format", "json",
			"--log-level", "debug",
		}, cfg.Args...),
		Env:          childEnv(cfg.Env),
		Stderr:       stderr,
		StartTimeout: startTimeout,
	})
	if err != nil {
		tb.Fatalf("e2e: %v\nstderr tail:\n%s", err, stderr.Tail(tailLines))
	}
	s := &Server{
		URL:      p.URL,
		Token:    p.Token,
		Addr:     p.Addr,
		StateDir: dir,
		AdminURL: p.AdminURL,
		Cmd:      p.Cmd,
		Stderr:   stderr,
		proc:     p,
	}
	tb.Cleanup(func() { s.stop(tb) })
	return s
}

// hasAdminListen reports whether cfg turns on --admin-listen.
func hasAdminListen(cfg Config) bool {
	return hostproc.HasAdminListen(cfg.Args, cfg.Env)
}

// stop is the cleanup registered by Start.
func (s *Server) stop(tb testing.TB) {
	if err := s.proc.Stop(stopTimeout); err != nil {
		tb.Errorf("e2e: %v", err)
	}
	// A race-built host or plugin reports data races on stderr (the host
	// re-emits its plugins' lines): any is a test failure.
	if strings.Contains(s.Stderr.String(), "WARNING: DATA RACE") {
		tb.Errorf("e2e: the race detector reported a data race in tether serve or a plugin")
	}
	if tb.Failed() {
		tb.Logf("e2e: tether serve (pid %d) %v; stderr tail:\n%s", s.proc.Pid(), s.proc.ExitDescription(), s.Stderr.Tail(tailLines))
	}
}

// killPTYPlugin stops the PTY plugin recorded in dir/plugins/pty.json, the
// one the host leaves running for the next host (docs/PROTOCOL.md §13.6),
// when it is still this binary: SIGTERM, SIGKILL after 5 s.
func killPTYPlugin(tb testing.TB, dir, bin string) {
	if hostproc.KillPTYPlugin(dir, bin, ptyGrace) {
		tb.Logf("e2e: PTY plugin recorded in %s still running %v after SIGTERM; killed it", dir, ptyGrace)
	}
}

// WSURL returns ws://ADDR + path with the token added to its query (path
// may carry a query of its own, kept verbatim).
func (s *Server) WSURL(path string) string {
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return "ws://" + s.Addr + path + sep + "token=" + url.QueryEscape(s.Token)
}

// Dial connects to /api/ws with the server's token, waits for the
// gateway.ready event and registers the client's Close as a cleanup. opts
// adjust the options (e.g. to set an Origin) before dialing.
func (s *Server) Dial(tb testing.TB, opts ...func(*wsclient.Options)) *wsclient.Client {
	tb.Helper()
	c, _ := s.DialReady(tb, opts...)
	return c
}

// DialReady is Dial that also returns the gateway.ready event. It fails the
// test if the first event is not gateway.ready (docs/PROTOCOL.md, section 6: it comes first).
func (s *Server) DialReady(tb testing.TB, opts ...func(*wsclient.Options)) (*wsclient.Client, wsclient.Event) {
	tb.Helper()
	o := wsclient.Options{Token: s.Token}
	for _, f := range opts {
		f(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	c, err := wsclient.Dial(ctx, "ws://"+s.Addr+"/api/ws", o)
	if err != nil {
		tb.Fatalf("e2e: dial /api/ws: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	e, err := c.NextEvent(ctx)
	if err != nil {
		tb.Fatalf("e2e: no gateway.ready on /api/ws: %v", err)
	}
	if e.Type != "gateway.ready" {
		tb.Fatalf("e2e: first event on /api/ws: got %s, want gateway.ready", e.Raw)
	}
	return c, e
}

// DialRaw connects to ws://ADDR + path with opts as given: no token is added
// unless opts.Token is set, no event is awaited and no cleanup registered
// (the caller closes the client). For access-control and PTY tests.
func (s *Server) DialRaw(ctx context.Context, path string, opts wsclient.Options) (*wsclient.Client, error) {
	return wsclient.Dial(ctx, "ws://"+s.Addr+path, opts)
}

// Get sends GET URL+path to the public listener and returns the status and
// body. It fails the test on a transport error.
func (s *Server) Get(tb testing.TB, path string) (status int, body string) {
	tb.Helper()
	return httpGet(tb, s.URL+path)
}

// AdminGet fetches path from the admin listener with the access token.
func (s *Server) AdminGet(tb testing.TB, path string) (status int, body string) {
	tb.Helper()
	if s.AdminURL == "" {
		tb.Fatalf("e2e: AdminGet %s: no admin URL; start the server with --admin-listen 127.0.0.1:0", path)
	}
	return httpGetAuth(tb, s.AdminURL+path, s.Token)
}

// httpGet fetches url without keeping the connection (no goroutine of an
// idle connection outlives the call).
func httpGet(tb testing.TB, url string) (int, string) {
	tb.Helper()
	return httpGetAuth(tb, url, "")
}

// httpGetAuth is httpGet with Authorization: Bearer token (when not "").
func httpGetAuth(tb testing.TB, url, token string) (int, string) {
	tb.Helper()
	client := &http.Client{
		Timeout:   httpTimeout,
		Transport: &http.Transport{DisableKeepAlives: true},
	}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		tb.Fatalf("e2e: GET %s: %v", url, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		tb.Fatalf("e2e: GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("e2e: GET %s: read body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// Signal sends sig to the tether serve process.
func (s *Server) Signal(sig os.Signal) error {
	return s.proc.Signal(sig)
}

// Wait waits up to timeout for the process to exit and returns its exit
// code. The error is not nil when it is still running after timeout (code
// -1) or was killed by a signal (code -1, the error names the signal).
func (s *Server) Wait(timeout time.Duration) (exitCode int, err error) {
	return s.proc.Wait(timeout)
}

// Exited returns a channel closed when the process has exited.
func (s *Server) Exited() <-chan struct{} {
	return s.proc.Exited()
}

// Stdout returns everything the process wrote to stdout so far.
func (s *Server) Stdout() string {
	return s.proc.Stdout()
}

// scrape returns the body of AdminURL/metrics; it fails the test (for
// what, the caller) when the server has no admin URL or the scrape fails.
func (s *Server) scrape(tb testing.TB, what string) string {
	tb.Helper()
	if s.AdminURL == "" {
		tb.Fatalf("e2e: %s: no admin URL; start the server with --admin-listen 127.0.0.1:0", what)
	}
	status, body := s.AdminGet(tb, "/metrics")
	if status != http.StatusOK {
		tb.Fatalf("e2e: GET %s/metrics: status %d\n%s", s.AdminURL, status, body)
	}
	return body
}

// HasMetric scrapes AdminURL/metrics and reports whether it has a sample
// of the metric called name whose labels include every "key=value" pair
// given, at any value (see HasSample). It fails the test like Metric.
func (s *Server) HasMetric(tb testing.TB, name string, labels ...string) bool {
	tb.Helper()
	ok, err := HasSample(s.scrape(tb, "HasMetric "+name), name, labels...)
	if err != nil {
		tb.Fatalf("e2e: HasMetric %s: %v", name, err)
	}
	return ok
}

// Metric scrapes AdminURL/metrics and returns the sum of the samples of the
// metric called name whose labels include every "key=value" pair given; 0
// when there is none (a labelled counter shows up only once counted). It
// fails the test when the server has no admin URL (start it with
// "--admin-listen", "127.0.0.1:0") or the scrape fails.
func (s *Server) Metric(tb testing.TB, name string, labels ...string) float64 {
	tb.Helper()
	v, err := SumMetric(s.scrape(tb, "Metric "+name), name, labels...)
	if err != nil {
		tb.Fatalf("e2e: Metric %s: %v", name, err)
	}
	return v
}
