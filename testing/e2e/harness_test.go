package e2e

import (
	"testing"
)

func TestSumMetric(t *testing.T) {
	const text = `# HELP tether_refused_total Connections refused.
# TYPE tether_refused_total counter
tether_refused_total{code="4401"} 3
tether_refused_total{code="4403"} 2
tether_refused_total{code="4408",path="/api/ws"} 1 1700000000000
tether_refused_totally 100
tether_live_sessions 4
tether_odd{v="a \"q\" \\ b,}"} 7
tether_lat_bucket{le="+Inf"} 9
tether_nan NaN
`
	tests := []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{name: "all samples", metric: "tether_refused_total", want: 6},
		{name: "one label", metric: "tether_refused_total", labels: []string{"code=4401"}, want: 3},
		{name: "two labels", metric: "tether_refused_total", labels: []string{"code=4408", "path=/api/ws"}, want: 1},
		{name: "no match", metric: "tether_refused_total", labels: []string{"code=1"}, want: 0},
		{name: "no labels", metric: "tether_live_sessions", want: 4},
		{name: "absent", metric: "tether_absent", want: 0},
		{name: "escapes", metric: "tether_odd", labels: []string{`v=a "q" \ b,}`}, want: 7},
		{name: "inf label", metric: "tether_lat_bucket", labels: []string{"le=+Inf"}, want: 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SumMetric(text, tt.metric, tt.labels...)
			if err != nil || got != tt.want {
				t.Errorf("SumMetric(%s, %v): got %v, %v; want %v", tt.metric, tt.labels, got, err, tt.want)
			}
		})
	}

	if _, err := SumMetric(text, "tether_live_sessions", "nokey"); err == nil {
		t.Error("label without =: got no error")
	}
	if _, err := SumMetric(`m{a="x} 1`, "m"); err == nil {
		t.Error("unterminated label value: got no error")
	}
	if _, err := SumMetric(`m{a=x} 1`, "m"); err == nil {
		t.Error("unquoted label value: got no error")
	}
	if _, err := SumMetric(`m one`, "m"); err == nil {
		t.Error("bad value: got no error")
	}
}

func TestWSURL(t *testing.T) {
	s := &Server{Addr: "127.0.0.1:7717", Token: "a+b/c"}
	tests := []struct {
		path string
		want string
	}{
		{path: "/api/ws", want: "ws://127.0.0.1:7717/api/ws?token=a%2Bb%2Fc"},
		{path: "/api/pty?attach=x_y&offset=3", want: "ws://127.0.0.1:7717/api/pty?attach=x_y&offset=3&token=a%2Bb%2Fc"},
	}
	for _, tt := range tests {
		if got := s.WSURL(tt.path); got != tt.want {
			t.Errorf("WSURL(%q): got %q, want %q", tt.path, got, tt.want)
		}
	}
}

func TestHasAdminListen(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want bool
	}{
		{name: "none", cfg: Config{Args: []string{"--agent", "echo"}}, want: false},
		{name: "separate value", cfg: Config{Args: []string{"--admin-listen", "127.0.0.1:0"}}, want: true},
		{name: "equals", cfg: Config{Args: []string{"--admin-listen=127.0.0.1:0"}}, want: true},
		{name: "single dash", cfg: Config{Args: []string{"-admin-listen", "127.0.0.1:0"}}, want: true},
		{name: "empty", cfg: Config{Args: []string{"--admin-listen="}}, want: false},
		{name: "env", cfg: Config{Env: []string{"TETHER_ADMIN_LISTEN=127.0.0.1:0"}}, want: true},
		{name: "value of another flag", cfg: Config{Args: []string{"--agent-command", "admin-listen"}}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := hasAdminListen(tt.cfg); got != tt.want {
				t.Errorf("hasAdminListen(%+v): got %v, want %v", tt.cfg, got, tt.want)
			}
		})
	}
}

func TestBufferTail(t *testing.T) {
	var b Buffer
	b.Write([]byte("a\nb\nc\n"))
	tests := []struct {
		n    int
		want string
	}{
		{n: 0, want: ""},
		{n: 1, want: "c"},
		{n: 2, want: "b\nc"},
		{n: 3, want: "a\nb\nc"},
		{n: 10, want: "a\nb\nc"},
	}
	for _, tt := range tests {
		if got := b.Tail(tt.n); got != tt.want {
			t.Errorf("Tail(%d): got %q, want %q", tt.n, got, tt.want)
		}
	}
}

func TestHasSample(t *testing.T) {
	const text = `# HELP tether_restarts_total Restarts.
# TYPE tether_restarts_total counter
tether_restarts_total{plugin="ws",reason="crashed"} 0
tether_restarts_totally{plugin="pty"} 1
tether_errors_total 0
`
	for _, tt := range []struct {
		metric string
		labels []string
		want   bool
	}{
		{"tether_restarts_total", nil, true},
		{"tether_restarts_total", []string{"plugin=ws", "reason=crashed"}, true},
		{"tether_restarts_total", []string{"plugin=pty"}, false},
		{"tether_errors_total", nil, true},
		{"tether_absent", nil, false},
	} {
		got, err := HasSample(text, tt.metric, tt.labels...)
		if err != nil || got != tt.want {
			t.Errorf("HasSample(%s, %v): got %v, %v; want %v", tt.metric, tt.labels, got, err, tt.want)
		}
	}
	if _, err := HasSample(text, "tether_errors_total", "nokey"); err == nil {
		t.Error("label without =: got no error")
	}
}
