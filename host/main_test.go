package host

import (
	"testing"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestMain checks for leaked goroutines (goleak, through e2e.Main) and
// removes the tether binary a test built with e2e.Build.
func TestMain(m *testing.M) {
	e2e.Main(m)
}
