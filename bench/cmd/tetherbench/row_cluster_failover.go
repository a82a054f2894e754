package main

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// rowClusterFailover: kill -9 of the host owning a session. Per
// repetition a fresh cluster with --cluster-ttl; then cfg.cluster.failovers
// times: a session is created on h2, h2 is killed (its whole process
// group: the host with its embedded NATS server, and its plugins), and a
// client on h1 calls session.resume of its key every 50 ms until it
// succeeds; the time from the kill to that success. h2 is then started
// again on its state dir, and rejoins, before the next kill.
func rowClusterFailover(cfg config, rep *report) error {
	o := cfg.cluster
	var p50, pmax, setupRetries sample
	var all []float64
	codes := map[int]int{}
	for r := 0; r < cfg.n; r++ {
		waitQuiet(5 * time.Second)
		took, retriesBefore, err := failoverRep(cfg, codes)
		if err != nil {
			return fmt.Errorf("repetition %d: %w", r, err)
		}
		tms := durationsMS(took)
		all = append(all, tms...)
		p50.add(percentile(tms, .5))
		pmax.add(percentile(tms, 1))
		setupRetries.add(float64(retriesBefore))
		logf(cfg, "cluster-failover rep %d: %v", r, took)
	}
	row := fmt.Sprintf("cluster-failover, --cluster-ttl %v", o.ttl)
	rep.add(result{row: row, metric: fmt.Sprintf("kill -9 → resumed on h1, p50 of %d", o.failovers), tether: p50.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: fmt.Sprintf("kill -9 → resumed on h1, max of %d", o.failovers), tether: pmax.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: fmt.Sprintf("pooled p50 / p99 of %d", len(all)), tether: fmt.Sprintf("%s / %s ms", num(percentile(all, .5)), num(percentile(all, .99))), n: cfg.n})
	rep.note("%s: a fresh cluster per repetition, %d kills each (h2 started again on its state dir after each); answers before the success, over all kills: %d × 5002, %d × 5003, %d other errors, %d sockets closed by h1 (then dialled again) (the call is made every 50 ms); all samples, sorted: %s",
		row, o.failovers, codes[wire.CodeOwnerUnreachable], codes[wire.CodeStorageUnavailable], codes[-1], codes[-2], fmtSorted(all))
	rep.note("%s: creating the next session on the restarted h2 was refused (5002/5003) %s times per repetition before it succeeded", row, setupRetries.cell(""))
	return nil
}

// failoverRep is one repetition of rowClusterFailover: the time to each
// failover, and how often the set-up's create on the restarted h2 had to
// be retried.
func failoverRep(cfg config, codes map[int]int) (took []time.Duration, setupRetries int, err error) {
	o := cfg.cluster
	cl, err := startCluster(cfg.bin, tetherOpts{extra: []string{"--cluster-ttl", o.ttl.String()}})
	if err != nil {
		return nil, 0, err
	}
	defer cl.stop()
	defer func() {
		if err != nil {
			err = fmt.Errorf("failover %d: %w; the hosts:%s", len(took), err, cl.state())
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for k := 0; k < o.failovers; k++ {
		d, retries, err := failover(ctx, cl, o.ttl, k, codes)
		setupRetries += retries
		if err != nil {
			return nil, 0, err
		}
		took = append(took, d)
		if err := cl.restart(1); err != nil {
			return nil, 0, err
		}
		// Until h1 sees h2's heartbeat again.
		if err := waitAlive(ctx, cl.hosts[0], 3, 30*time.Second); err != nil {
			return nil, 0, err
		}
		waitQuiet(3 * time.Second)
	}
	return took, setupRetries, nil
}

// failover is failover k of a repetition: a session created on h2, h2
// killed (its process group), and the session resumed on h1; the time
// from the kill to that success, and how often the create was refused.
// h2 is down when it returns.
func failover(ctx context.Context, cl *cluster, ttl time.Duration, k int, codes map[int]int) (took time.Duration, setupRetries int, err error) {
	victim := cl.hosts[1]
	owner, err := dialHost(ctx, victim, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("dial h2: %w", err)
	}
	defer owner.Abort()
	snap, setupRetries, err := createRetrying(ctx, owner, fmt.Sprintf("failover-%d", k))
	if err != nil {
		return 0, setupRetries, fmt.Errorf("create on h2: %w", err)
	}
	c, err := dialHost(ctx, cl.hosts[0], nil)
	if err != nil {
		return 0, setupRetries, fmt.Errorf("dial h1: %w", err)
	}
	defer func() {
		if c != nil { // nil when dialling it again failed
			c.Abort()
		}
	}()
	time.Sleep(200 * time.Millisecond) // a heartbeat or two with the session owned

	if err := syscall.Kill(-victim.pid(), syscall.SIGKILL); err != nil {
		return 0, setupRetries, err
	}
	killed := time.Now()
	got, err := resumeAfterKill(ctx, cl, &c, snap.SessionKey, killed, ttl, codes)
	if err != nil {
		return 0, setupRetries, err
	}
	took = time.Since(killed)
	owner.Abort()
	victim.kill() // reaps it, and a PTY plugin it left
	cl.hosts[1] = nil
	if got.SessionKey != snap.SessionKey || got.Epoch != snap.Epoch {
		return 0, setupRetries, fmt.Errorf("resume after the failover gave %s epoch %s, want %s epoch %s", got.SessionKey, got.Epoch, snap.SessionKey, snap.Epoch)
	}
	if _, err := c.CloseSession(ctx, got.SessionID); err != nil {
		return 0, setupRetries, err
	}
	return took, setupRetries, nil
}

// createRetrying creates a session on c, retrying every 50 ms for up to
// 30 s while it is refused with 5002/5003: right after a restart the
// streams h2's NATS server led may still be changing hands. It returns
// how often it was refused.
func createRetrying(ctx context.Context, c *client.Conn, title string) (wire.Snapshot, int, error) {
	retries := 0
	for t0 := time.Now(); ; {
		snap, err := c.Create(ctx, wire.CreateParams{Title: title})
		if err == nil {
			return snap, retries, nil
		}
		if !retryable(err) || time.Since(t0) > 30*time.Second {
			return wire.Snapshot{}, retries, err
		}
		retries++
		time.Sleep(50 * time.Millisecond)
	}
}

// resumeAfterKill calls session.resume of key on *c (on h1) every 50 ms
// until it succeeds, counting the answers before in codes (-1: another
// error, -2: the socket closed, then *c is dialled again); it gives up
// ttl + 60 s after killed.
func resumeAfterKill(ctx context.Context, cl *cluster, c **client.Conn, key string, killed time.Time, ttl time.Duration, codes map[int]int) (wire.Snapshot, error) {
	for {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		got, err := (*c).Resume(cctx, wire.ResumeParams{SessionID: key})
		ccancel()
		if err == nil {
			return got, nil
		}
		var ce *client.CloseError
		switch {
		case retryable(err):
			codes[client.ErrorCode(err)]++
		case client.ErrorCode(err) != 0:
			codes[-1]++ // another error answered: counted, and retried
		case errors.As(err, &ce):
			// h1 relayed the call to the dead owner and closed the
			// socket when it saw the owner gone (1001 "owner host
			// gone; resume"): dial again, as a client would.
			codes[-2]++
			(*c).Abort()
			if *c, err = dialHost(ctx, cl.hosts[0], nil); err != nil {
				return wire.Snapshot{}, fmt.Errorf("dial h1 again: %w", err)
			}
		default:
			return wire.Snapshot{}, fmt.Errorf("resume on h1 after the kill: %w", err)
		}
		if time.Since(killed) > ttl+60*time.Second {
			return wire.Snapshot{}, fmt.Errorf("still no resume %v after the kill (ttl %v): %w", time.Since(killed), ttl, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
