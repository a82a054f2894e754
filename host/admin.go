package host

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/metrics"
)

// serveAdmin serves the admin listener: /metrics, /healthz and, with
// cfg.Pprof, /debug/pprof. Every request must pass the Host check (403:
// a DNS-rebinding page cannot read it) and present the access token
// (Authorization: Bearer, or ?token= for a browser; else 401): a CPU
// profile or the process's command line is not for anyone who can reach
// the port.
func serveAdmin(cfg Config, creds *access.Book, m *metrics.Metrics) (stop func(), addr string, err error) {
	ln, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		return nil, "", fmt.Errorf("admin listener: %w", err)
	}
	acc := &access.Access{Book: creds, Bound: ln.Addr().String(), AllowHosts: cfg.AllowHosts}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	guard := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !acc.HostOK(r.Host) {
			http.Error(w, "forbidden host", http.StatusForbidden)
			return
		}
		token := r.URL.Query().Get("token")
		if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
			token = strings.TrimSpace(h[7:])
		}
		if who, err := acc.Verify(token); err != nil || !who.Admin() {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tether admin"`)
			http.Error(w, "unauthorized: present the access token (Authorization: Bearer TOKEN, or ?token=TOKEN)", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: guard, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Log.Error().Err(err).Msg("admin listener")
		}
	}()
	return func() {
		_ = srv.Close()
		<-done
	}, ln.Addr().String(), nil
}
