package relay

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Every server a test starts is shut down and waited for, every
	// connection closed, every leg's goroutine ended.
	goleak.VerifyTestMain(m)
}
