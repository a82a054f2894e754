package session

import (
	"flag"
	"testing"

	"go.uber.org/goleak"
)

// modelChecks is how many random runs the model test makes unless
// -rapid.checks says otherwise: enough that the interleavings it exists
// for (a stale close_on_disconnect teardown needs several steps in a
// row) come up in every run.
const modelChecks = "250"

// checksGiven: -rapid.checks was on the command line (then every model
// test makes that many runs).
var checksGiven bool

func TestMain(m *testing.M) {
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { checksGiven = checksGiven || f.Name == "rapid.checks" })
	if !checksGiven {
		_ = flag.Set("rapid.checks", modelChecks)
	}
	goleak.VerifyTestMain(m)
}

// withChecks makes the rapid tests of t run n checks, unless
// -rapid.checks said how many (tests of this package run one at a time).
func withChecks(t *testing.T, n string) {
	if checksGiven {
		return
	}
	old := flag.Lookup("rapid.checks").Value.String()
	_ = flag.Set("rapid.checks", n)
	t.Cleanup(func() { _ = flag.Set("rapid.checks", old) })
}
