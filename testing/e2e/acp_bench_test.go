package e2e_test

import (
	"encoding/json"
	"testing"
)

// benchRun is what testing/acp/bench.mjs prints (the fields checked here).
type benchRun struct {
	Latency *struct {
		N  int       `json:"n"`
		MS []float64 `json:"ms"`
	} `json:"latency"`
	Throughput *struct {
		N       int `json:"n"`
		Prompts int `json:"prompts"`
	} `json:"throughput"`
	Load *struct {
		Replayed int      `json:"replayed"`
		Complete bool     `json:"complete"`
		Problems []string `json:"problems"`
	} `json:"load"`
	Single *struct {
		Completed bool `json:"completed"`
		Received  int  `json:"received"`
	} `json:"single"`
	Errors []string `json:"errors"`
}

// TestACPBenchClient runs the benchmark client (testing/acp/bench.mjs, the
// instrument of the acp row of bench/cmd/tetherbench) with small sizes
// against the test agent behind the relay and behind tether: the agent's
// `bench` mode stamps each update's own _meta with its send time, which
// must reach the client on both ways (bench.mjs checks every update's text,
// order and _meta["agent/t"]), the latencies must be real ones, and the
// session/load of the filled session must replay it whole.
func TestACPBenchClient(t *testing.T) {
	const token = "bench-token"
	args := []string{"--warmup", "5", "--paced", "20", "--delay", "1", "--updates", "250", "--burst", "100", "--load", "--single", "50"}
	check := func(t *testing.T, out []byte) {
		var r benchRun
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("bench.mjs printed %q: %v", out, err)
		}
		if len(r.Errors) > 0 {
			t.Errorf("bench.mjs errors: %q", r.Errors)
		}
		if r.Latency == nil || r.Latency.N != 20 || len(r.Latency.MS) != 20 {
			t.Fatalf("latency phase: %+v, want 20 updates", r.Latency)
		}
		for i, ms := range r.Latency.MS {
			// One clock (CLOCK_MONOTONIC) on both ends: a latency is
			// positive and far below the test's own time.
			if !(ms > 0 && ms < 10000) {
				t.Errorf("latency of update %d: %v ms, want 0 < it < 10 s", i, ms)
			}
		}
		if r.Throughput == nil || r.Throughput.N != 250 || r.Throughput.Prompts != 3 {
			t.Errorf("throughput phase: %+v, want 250 updates in 3 prompts", r.Throughput)
		}
		if r.Load == nil || !r.Load.Complete || r.Load.Replayed != 253 {
			t.Errorf("load: %+v, want 253 updates replayed (3 prompts and their 250 chunks), whole", r.Load)
		}
		if r.Single == nil || !r.Single.Completed || r.Single.Received != 50 {
			t.Errorf("single prompt: %+v, want 50 updates, completed", r.Single)
		}
	}
	t.Run("relay", func(t *testing.T) {
		r := startRelay(t, token)
		check(t, runNode(t, []string{"ACP_TEST_TOKEN=" + token}, "bench.mjs", append([]string{r.URL}, args...)...))
	})
	t.Run("tether", func(t *testing.T) {
		h := startACPHost(t, acpHostConfig{})
		check(t, runNode(t, []string{"ACP_TEST_TOKEN=" + h.Token}, "bench.mjs", append([]string{acpURL(h.Server)}, args...)...))
	})
}
