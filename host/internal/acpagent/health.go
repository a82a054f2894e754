package acpagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/coder/acp-go-sdk"
)

// pingMethod is the health ping: an ACP extension method no agent
// implements, so a live agent answers "method not found".
const pingMethod = "_tether/ping"

// watch checks every HealthInterval that p is alive until it exits, and
// kills one that is not (supervise restarts it, reason unresponsive).
//
// It pings p first: a ping not answered within HealthTimeout is a hung
// agent. An answer that is a JSON-RPC error (an agent that does not know
// the ping, as most do not) also says the agent is alive, but many agents
// write a complaint to stderr for every request they do not know, so
// after one such answer p is not pinged again: from then on a process
// stopped (SIGSTOP, state T in /proc) for longer than HealthTimeout is
// the hung agent. An agent whose process state cannot be read (no /proc)
// keeps being pinged.
func (f *Factory) watch(p *process) {
	defer f.wg.Done()
	timeout := cmpOr(f.cfg.HealthTimeout, 3*time.Second)
	tick := time.NewTicker(f.cfg.HealthInterval)
	defer tick.Stop()
	pid := p.cmd.Process.Pid
	ping := true
	var stoppedSince time.Time // when p was first seen stopped, while it is
	for {
		select {
		case <-p.done:
			return
		case <-f.stop:
			return
		case <-tick.C:
		}
		if f.cfg.watched != nil {
			select {
			case f.cfg.watched <- ping:
			default:
			}
		}
		if !ping {
			stopped, err := processStopped(pid)
			switch {
			case err != nil || !stopped:
				stoppedSince = time.Time{}
				continue
			case stoppedSince.IsZero():
				stoppedSince = time.Now()
				continue
			case time.Since(stoppedSince) < timeout:
				continue
			}
			p.unresponsive.Store(true)
			f.log.Warn().Int("pid", pid).Str("timeout", timeout.String()).Msg("acp agent has been stopped (SIGSTOP) for longer than its health timeout; killing it to restart it")
			p.kill()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_, err := p.conn.CallExtension(ctx, pingMethod, struct{}{})
		cancel()
		var re *acp.RequestError
		switch {
		case err == nil || p.dead():
			continue // answered (or gone, which supervise sees)
		case errors.As(err, &re) && re.Code != -32603:
			if _, serr := processStopped(pid); serr == nil {
				ping = false
				f.log.Debug().Int("pid", pid).Int("code", re.Code).Str("message", re.Message).
					Msg("acp agent answered its health ping with an error (alive); not pinging it again, watching its process state instead")
			}
			continue
		case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
			p.unresponsive.Store(true)
			f.log.Warn().Int("pid", pid).Str("timeout", timeout.String()).Msg("acp agent did not answer its health ping in time; killing it to restart it")
			p.kill()
			return
		}
	}
}

// processStopped reports whether process pid is stopped by a signal or
// a tracer (state T or t in /proc/PID/stat); an error when its state
// cannot be read (not Linux, or the process is gone).
func processStopped(pid int) (bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false, fmt.Errorf("process state of %d: %w", pid, err)
	}
	// "PID (COMM) STATE …": COMM may hold spaces and parentheses, so the
	// state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false, fmt.Errorf("process state of %d: malformed %q", pid, b)
	}
	st := b[i+2]
	return st == 'T' || st == 't', nil
}
