//go:build !linux

package supervise

import (
	"errors"
	"time"
)

// readProc cannot tell a process's start time without /proc: every
// record is judged stale, and plugins are never reattached.
func readProc(int) procInfo { return procInfo{} }

// procStartTicks is not available without /proc.
func procStartTicks(int) (uint64, error) {
	return 0, errors.New("process start times need /proc")
}

// procStartTime is not available without /proc.
func procStartTime(uint64) (time.Time, bool) { return time.Time{}, false }
