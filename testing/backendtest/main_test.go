package backendtest_test

import (
	"testing"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestMain checks for leaked goroutines and removes the tether binary
// subprocess_test.go builds.
func TestMain(m *testing.M) { e2e.Main(m) }
