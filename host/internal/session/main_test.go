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

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "rapid.checks" })
	if !given {
		_ = flag.Set("rapid.checks", modelChecks)
	}
	goleak.VerifyTestMain(m)
}
