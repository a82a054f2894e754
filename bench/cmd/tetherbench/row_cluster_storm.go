package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// raceLost reports whether err is 4007 "session no longer live; retry
// resume": the resume kept losing races for the key (PROTOCOL.md says
// retry), not the 4007 of a key that does not exist.
func raceLost(err error) bool {
	return client.ErrorCode(err) == wire.CodeStoredNotFound && strings.Contains(err.Error(), "retry")
}

// rowClusterStorm: the resume storm across three hosts. Per repetition a
// session is created on h1 and closed (stored, not live); cfg.cluster.storm
// sockets spread evenly over h1..h3 resume its key at once, retrying on
// 5002/5003 and on 4007 "no longer live; retry resume" every 20 ms;
// latency per socket from the release to its answer. Exactly one session must result: one id in every answer, and
// one live session for the key in every host's session.active_list.
func rowClusterStorm(cfg config, rep *report) error {
	o := cfg.cluster
	cl, err := startCluster(cfg.bin, tetherOpts{})
	if err != nil {
		return err
	}
	defer cl.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ctls := make([]*client.Conn, 3)
	for i, h := range cl.hosts {
		if ctls[i], err = dialHost(ctx, h, nil); err != nil {
			return err
		}
		defer ctls[i].Abort()
	}

	var p50, p99, pmax, retried sample
	exact := 0
	var bad []string
	retries := map[int]int{}
	for r := 0; r < cfg.n; r++ {
		st, err := clusterStormRep(ctx, cl, ctls, o.storm, r)
		if err != nil {
			return err
		}
		if st.ok {
			exact++
		} else {
			bad = append(bad, fmt.Sprintf("rep %d: %d distinct ids answered; %s", r, st.distinct, strings.Join(st.lives, ", ")))
		}
		for code, k := range st.retries {
			retries[code] += k
		}
		lms := durationsMS(st.lat)
		p50.add(percentile(lms, .5))
		p99.add(percentile(lms, .99))
		pmax.add(percentile(lms, 1))
		retried.add(float64(st.retried))
		logf(cfg, "cluster-storm rep %d: p50 %.2fms p99 %.2fms max %.2fms; %d sockets retried; %s", r, percentile(lms, .5), percentile(lms, .99), percentile(lms, 1), st.retried, strings.Join(st.lives, ", "))
		time.Sleep(500 * time.Millisecond) // the hosts tear down the viewers
		waitQuiet(3 * time.Second)
	}
	row := fmt.Sprintf("cluster-storm ×%d over 3 hosts", o.storm)
	rep.add(result{row: row, metric: "p50", tether: p50.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "p99", tether: p99.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "max", tether: pmax.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "sockets that retried", tether: retried.cell(""), n: cfg.n})
	rep.add(result{row: row, metric: "one live session", tether: fmt.Sprintf("%d/%d", exact, cfg.n),
		target: "every repetition", met: yesNo(exact == cfg.n), n: cfg.n})
	rep.note("%s: retries over all repetitions: %d × 5002, %d × 5003, %d × 4007 \"session no longer live; retry resume\" (every 20 ms until answered); latency is from the release to the successful answer, retries included", row, retries[wire.CodeOwnerUnreachable], retries[wire.CodeStorageUnavailable], retries[wire.CodeStoredNotFound])
	for _, b := range bad {
		rep.note("%s: %s", row, b)
	}
	if exact != cfg.n {
		return fmt.Errorf("%d of %d storms did not end with exactly one session", cfg.n-exact, cfg.n)
	}
	return nil
}

// stormOutcome is one storm of the cluster-storm row.
type stormOutcome struct {
	lat      []time.Duration // per socket, release → answer
	retried  int             // sockets that retried
	retries  map[int]int     // error code → retries, over all sockets
	distinct int             // session ids answered
	ok       bool            // one id, and one live session with every socket on every host
	lives    []string        // per host, what its session.active_list says
}

// clusterStormRep is repetition r of the cluster-storm row: a session
// created on h1 and closed, then storm sockets spread evenly over the
// hosts resume its key at once. ctls are a socket per host. The sockets
// are closed, and the session too, before it returns.
func clusterStormRep(ctx context.Context, cl *cluster, ctls []*client.Conn, storm, r int) (stormOutcome, error) {
	snap, err := ctls[0].Create(ctx, wire.CreateParams{Title: fmt.Sprintf("cluster-storm-%d", r)})
	if err != nil {
		return stormOutcome{}, err
	}
	if _, err := ctls[0].CloseSession(ctx, snap.SessionID); err != nil {
		return stormOutcome{}, err
	}
	var socks []*client.Conn
	var hostOf []int
	for i, h := range cl.hosts {
		k := storm / 3
		if i < storm%3 {
			k++
		}
		cs, err := dialMany(ctx, h, k)
		if err != nil {
			return stormOutcome{}, fmt.Errorf("dialing %d sockets to h%d: %w", k, i+1, err)
		}
		socks = append(socks, cs...)
		for range cs {
			hostOf = append(hostOf, i)
		}
	}
	lat, ids, errs, tries := resumeAtOnce(ctx, socks, snap.SessionKey)
	st := stormOutcome{lat: lat, retries: map[int]int{}}
	distinct := map[string]bool{}
	for i := range socks {
		if errs[i] != nil {
			return stormOutcome{}, fmt.Errorf("resume %d on h%d: %w", i, hostOf[i]+1, errs[i])
		}
		distinct[ids[i]] = true
		if len(tries[i]) > 0 {
			st.retried++
		}
		for code, k := range tries[i] {
			st.retries[code] += k
		}
	}
	st.distinct = len(distinct)
	st.ok = len(distinct) == 1
	for i, ctl := range ctls {
		active, err := ctl.ActiveList(ctx)
		if err != nil {
			return stormOutcome{}, err
		}
		live, viewers := 0, 0
		for _, s := range active {
			if s.SessionKey == snap.SessionKey {
				live++
				viewers = s.Viewers
				st.ok = st.ok && distinct[s.ID]
			}
		}
		st.ok = st.ok && live == 1 && viewers == len(socks)
		st.lives = append(st.lives, fmt.Sprintf("h%d: %d live, %d viewers", i+1, live, viewers))
	}
	for id := range distinct {
		if _, err := ctls[0].CloseSession(ctx, id); err != nil {
			return stormOutcome{}, err
		}
	}
	for _, c := range socks {
		c.Abort()
	}
	return st, nil
}

// resumeAtOnce has every socket resume key at the same moment, retrying
// on 5002/5003 and on 4007 "no longer live; retry resume" every 20 ms for
// up to 30 s. Per socket: the time from the release to the answer, the
// session id answered, the error that ended it, and the retries by code.
func resumeAtOnce(ctx context.Context, socks []*client.Conn, key string) (lat []time.Duration, ids []string, errs []error, tries []map[int]int) {
	lat = make([]time.Duration, len(socks))
	ids = make([]string, len(socks))
	errs = make([]error, len(socks))
	tries = make([]map[int]int, len(socks))
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range socks {
		wg.Go(func() {
			tries[i] = map[int]int{}
			<-gate
			t0 := time.Now()
			for {
				cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
				s, err := c.Resume(cctx, wire.ResumeParams{SessionID: key})
				ccancel()
				if err == nil {
					lat[i], ids[i] = time.Since(t0), s.SessionID
					return
				}
				if !retryable(err) && !raceLost(err) || time.Since(t0) > 30*time.Second {
					errs[i] = err
					return
				}
				tries[i][client.ErrorCode(err)]++
				time.Sleep(20 * time.Millisecond) // the client's retry backoff
			}
		})
	}
	time.Sleep(50 * time.Millisecond) // every goroutine parked at the gate
	close(gate)
	wg.Wait()
	return lat, ids, errs, tries
}
