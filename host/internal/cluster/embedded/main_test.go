package embedded_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Every server a test starts is shut down and waited for, every
	// connection closed: nothing is left running.
	goleak.VerifyTestMain(m)
}
