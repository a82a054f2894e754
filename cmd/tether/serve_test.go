package main

import (
	"context"
	"testing"
	"time"
)

// TestStopWatchdog: the process is ended a fixed time after the stop
// signal only when serve has not returned by then; never without a
// signal, never after serve returned.
func TestStopWatchdog(t *testing.T) {
	run := func(signal, serveReturns bool, d time.Duration) bool {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		served := make(chan struct{})
		exited := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			stopWatchdog(ctx, served, d, func() { close(exited) })
		}()
		if signal {
			cancel()
		}
		if serveReturns {
			close(served)
		}
		select {
		case <-exited:
			<-done
			return true
		case <-done:
			return false
		case <-time.After(2 * time.Second):
			// Neither: the watchdog still waits (no signal, serve running).
			close(served)
			<-done
			return false
		}
	}
	if !run(true, false, 10*time.Millisecond) {
		t.Error("a stop that did not finish: the watchdog did not end the process")
	}
	if run(true, true, time.Hour) {
		t.Error("serve returned after the signal: the watchdog ended the process anyway")
	}
	if run(false, false, 10*time.Millisecond) {
		t.Error("no stop signal: the watchdog ended the process")
	}
	if run(false, true, 10*time.Millisecond) {
		t.Error("serve returned without a signal: the watchdog ended the process")
	}
}
