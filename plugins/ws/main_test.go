package ws_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain()) // a helper process of TestFDLimit
	}
	goleak.VerifyTestMain(m)
}
