package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

const pollEvery = 5 * time.Millisecond

// healthy reports whether GET /healthz answers 200 (fresh connection).
func healthy(client *http.Client, addr string) bool {
	resp, err := client.Get("http://" + addr + "/healthz")
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// wsPluginRecovery kills the WS plugin of a fresh tether and times the
// way back to /healthz 200.
func wsPluginRecovery(cfg config) (time.Duration, error) {
	ts, err := startTether(cfg.bin, tetherOpts{})
	if err != nil {
		return 0, err
	}
	defer ts.stop()
	pid, err := pluginPID(ts.pid(), "ws")
	if err != nil {
		return 0, err
	}
	client := &http.Client{Timeout: 100 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	if !healthy(client, ts.addr) {
		return 0, fmt.Errorf("not healthy before the kill")
	}
	t0 := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return 0, err
	}
	sawDown := false
	for time.Since(t0) < 30*time.Second {
		if healthy(client, ts.addr) {
			if !sawDown {
				// Still the old process (not yet reaped by the kernel's
				// socket teardown)? Make sure it is gone.
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil && ppid(pid) == ts.pid() && !zombie(pid) {
					time.Sleep(pollEvery)
					continue
				}
			}
			return time.Since(t0), nil
		}
		sawDown = true
		time.Sleep(pollEvery)
	}
	return 0, fmt.Errorf("/healthz not 200 within 30s of kill -9; stderr:\n%s", ts.stderr)
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := len(b)
	for j := len(b) - 1; j >= 0; j-- {
		if b[j] == ')' {
			i = j
			break
		}
	}
	return i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

// ptyAttached attaches to the PTY of attach at the host at base until a
// pty.replay header arrives; it returns the header and when it came.
func ptyAttached(ctx context.Context, base, token, attach string) (wire.Replay, time.Time, error) {
	for {
		p, err := client.AttachPTY(ctx, base, attach, client.PTYOptions{
			Options: client.Options{Token: token, DialTimeout: 2 * time.Second},
		})
		if err == nil {
			at := time.Now()
			rf := p.Replay()
			_ = p.Close()
			return rf, at, nil
		}
		if ctx.Err() != nil {
			return wire.Replay{}, time.Time{}, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		}
		time.Sleep(pollEvery)
	}
}

// coldStart starts tether on a known port and times exec to the URL line
// and exec to the first /api/pty attach answered. When the PTY plugin
// outlives the host (docs/PROTOCOL.md 13.6, pty.json in the state dir), it also times
// a restart to the same PTY answered again (same epoch).
func coldStart(cfg config) (urlLine, ptyReady, reattach time.Duration, err error) {
	addr, err := freePort()
	if err != nil {
		return 0, 0, 0, err
	}
	token := randToken()
	state, err := os.MkdirTemp(tmpRoot, "state-")
	if err != nil {
		return 0, 0, 0, err
	}
	o := tetherOpts{listen: addr, token: token, stateDir: state, ptyCommand: "sleep 3600"}
	base, attach := "http://"+addr, randToken()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	type res struct {
		rf  wire.Replay
		err error
		at  time.Time
	}
	measure := func() (time.Duration, time.Duration, wire.Replay, *server, error) {
		done := make(chan res, 1)
		t0 := time.Now()
		go func() {
			rf, at, err := ptyAttached(ctx, base, token, attach)
			done <- res{rf, err, at}
		}()
		ts, err := startTether(cfg.bin, o)
		line := time.Since(t0)
		if err != nil {
			return 0, 0, wire.Replay{}, nil, err
		}
		r := <-done
		if r.err != nil {
			return 0, 0, r.rf, ts, r.err
		}
		return line, r.at.Sub(t0), r.rf, ts, nil
	}
	line, ready, first, ts, err := measure()
	if err != nil {
		ts.stop()
		return 0, 0, 0, err
	}
	ts.stopKeepPTY()
	if _, err := os.Stat(filepath.Join(state, "plugins", "pty.json")); err != nil {
		ts.killLeftPTYPlugin()
		return line, ready, -1, nil // the PTY plugin stopped with its host
	}
	_, again, rf, ts2, err := measure()
	defer ts2.stop()
	defer ts.killLeftPTYPlugin() // in case the second host did not take it over
	if err != nil {
		return line, ready, 0, err
	}
	if rf.Epoch != first.Epoch {
		return line, ready, 0, fmt.Errorf("restarted host answered epoch %s, want %s (PTY not reattached)", rf.Epoch, first.Epoch)
	}
	return line, ready, again, nil
}

func rowRecovery(cfg config, rep *report) error {
	var kill, line, ready, re sample
	noReattach := false
	for r := 0; r < cfg.n; r++ {
		d, err := wsPluginRecovery(cfg)
		if err != nil {
			return err
		}
		kill.add(ms(d))
		l, p, a, err := coldStart(cfg)
		if err != nil {
			return err
		}
		line.add(ms(l))
		ready.add(ms(p))
		if a < 0 {
			noReattach = true
		} else {
			re.add(ms(a))
		}
		logf(cfg, "recovery rep %d: ws kill->healthz %.1fms; start->url %.1fms, start->pty %.1fms, restart->pty reattached %v", r, ms(d), ms(l), ms(p), a)
	}
	rep.add(result{row: "recovery", metric: "kill -9 ws plugin → /healthz 200", tether: kill.cell("ms"), n: cfg.n})
	rep.add(result{row: "recovery", metric: "host start → URL line", tether: line.cell("ms"), n: cfg.n})
	rep.add(result{row: "recovery", metric: "host start → /api/pty attach answered", tether: ready.cell("ms"), n: cfg.n})
	if noReattach {
		rep.note("recovery: no pty.json after the host stopped: this build's PTY plugin stops with its host, so host restart → PTY reattached cannot be measured yet")
	} else {
		rep.add(result{row: "recovery", metric: "host restart → same PTY attached", tether: re.cell("ms"), n: cfg.n})
	}
	rep.note("recovery: each kill on a fresh host (the supervisor's backoff grows with repeated crashes); polls every %v", pollEvery)
	return nil
}
