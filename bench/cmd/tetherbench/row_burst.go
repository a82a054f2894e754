package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// burstTries bounds the submits of one client of the burst row: the
// first, then one after each 5003's retry_after_ms.
const burstTries = 20

// burstResult is one repetition of the burst row.
type burstResult struct {
	served, firstServed int         // every client's prompt served; at its first try
	overloaded          int         // 5003 answers with retry_after_ms (then retried)
	other               int         // any other error: the row fails
	codes               map[int]int // the other errors by code (0: not an error answer)
	firstOther          string
	lat                 []time.Duration // release → served, per client
	commits, writes     float64         // the store's transactions and writes during the burst
	groupMax            float64         // the most writes in one transaction
}

// rowBurst: cfg.burst clients, each with a session of its own, submit
// a prompt at the same instant, on a fresh host per repetition. Every
// call must be served or answered 5003 with data.retry_after_ms (then
// submitted again after it); any other answer (5000 above all) fails
// the row. It reports how many were served at once, the 5003s, the time
// until every prompt was started, and the store's commits and group
// sizes during the burst (tether_store_commits_total and _writes_total).
func rowBurst(cfg config, rep *report) error {
	n := cfg.burst
	row := fmt.Sprintf("prompt burst ×%d", n)
	var served, overloaded, other, started, p99, commits, perCommit, groupMax sample
	var failures []string
	for r := 0; r < cfg.n; r++ {
		res, err := burstRound(cfg, n)
		if err != nil {
			return err
		}
		lms := durationsMS(res.lat)
		logf(cfg, "burst rep %d: %d served (%d at once), %d × 5003, %d other; all started in %.0f ms; %v writes in %v commits", r, res.served, res.firstServed, res.overloaded, res.other, percentile(lms, 1), res.writes, res.commits)
		served.add(float64(res.firstServed))
		overloaded.add(float64(res.overloaded))
		other.add(float64(res.other))
		started.add(percentile(lms, 1))
		p99.add(percentile(lms, .99))
		if res.commits > 0 {
			commits.add(res.commits)
			perCommit.add(res.writes / res.commits)
			groupMax.add(res.groupMax)
		}
		if res.other > 0 {
			failures = append(failures, fmt.Sprintf("rep %d: %d other errors (%s), the first: %s", r, res.other, countCodes(res.codes), res.firstOther))
		}
	}
	rep.add(result{row: row, metric: "served at the first try", tether: served.cell(""), n: cfg.n})
	rep.add(result{row: row, metric: "5003 (retried after retry_after_ms)", tether: overloaded.cell(""), n: cfg.n})
	rep.add(result{row: row, metric: "other errors", tether: other.cell(""), target: "0", met: yesNo(len(failures) == 0), n: cfg.n})
	rep.add(result{row: row, metric: "all started", tether: started.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "p99 submit", tether: p99.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "store commits", tether: commits.cell(""), n: cfg.n})
	rep.add(result{row: row, metric: "writes per commit", tether: perCommit.cell(""), n: cfg.n})
	rep.add(result{row: row, metric: "largest group", tether: groupMax.cell(""), n: cfg.n})
	rep.note("%s: a fresh host per repetition; each client its own socket and session, made before the release; a 5003 with retry_after_ms is submitted again after it (and up to half as much at random), at most %d tries; commits and writes are the host's tether_store_commits_total and _writes_total over the burst", row, burstTries)
	for _, f := range failures {
		rep.note("%s: %s", row, f)
	}
	if len(failures) > 0 {
		return fmt.Errorf("%s: %s", row, strings.Join(failures, "; "))
	}
	return nil
}

// burstRound is one repetition of the burst row on a fresh host.
func burstRound(cfg config, n int) (burstResult, error) {
	var res burstResult
	ts, err := startTether(cfg.bin, tetherOpts{admin: true})
	if err != nil {
		return res, err
	}
	defer ts.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	conns := make([]*client.Conn, n)
	sids := make([]string, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Abort()
			}
		}
	}()
	// Each client dials and makes its session, 64 at a time; the
	// client library's own retries are off, to count every 5003.
	if err := parallel(n, 64, func(i int) error {
		c, err := client.Dial(ctx, ts.baseURL(), client.Options{Token: ts.token, OverloadRetries: -1, OnEvent: func(client.Event) {}})
		if err != nil {
			return err
		}
		conns[i] = c
		snap, err := c.Create(ctx, wire.CreateParams{Title: fmt.Sprintf("burst-%d", i)})
		sids[i] = snap.SessionID
		return err
	}); err != nil {
		return res, fmt.Errorf("burst set-up: %w", err)
	}
	before, _ := scrapeMetrics(ts.admin, ts.token) // a host without the series reports none
	release := make(chan struct{})
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	res.lat = make([]time.Duration, 0, n)
	res.codes = map[int]int{}
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			t0 := time.Now()
			overloaded := 0
			var err error
			for try := 0; try < burstTries; try++ {
				if _, err = conns[i].Submit(ctx, sids[i], "burst"); err == nil {
					break
				}
				wait, ok := client.RetryAfter(err)
				if !ok {
					break
				}
				overloaded++
				time.Sleep(wait + rand.N(wait/2+1))
			}
			lat := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			res.overloaded += overloaded
			switch {
			case err == nil:
				res.served++
				if overloaded == 0 {
					res.firstServed++
				}
				res.lat = append(res.lat, lat)
			default:
				res.other++
				res.codes[client.ErrorCode(err)]++
				if res.firstOther == "" {
					res.firstOther = err.Error()
				}
			}
		}()
	}
	close(release)
	wg.Wait()
	after, err := scrapeMetrics(ts.admin, ts.token)
	if err == nil && before != nil {
		res.commits = after["tether_store_commits_total"] - before["tether_store_commits_total"]
		res.writes = after["tether_store_writes_total"] - before["tether_store_writes_total"]
		res.groupMax = after["tether_store_group_max"]
	}
	return res, nil
}

// countCodes formats errors counted by code: "1309 × 5000, 2 × 0".
func countCodes(codes map[int]int) string {
	keys := make([]int, 0, len(codes))
	for c := range codes {
		keys = append(keys, c)
	}
	sort.Ints(keys)
	parts := make([]string, len(keys))
	for i, c := range keys {
		parts[i] = fmt.Sprintf("%d × %d", codes[c], c)
	}
	return strings.Join(parts, ", ")
}

// parallel runs fn(0…n-1), at most width at once, and returns the first
// error.
func parallel(n, width int, fn func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, width)
	)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(i); err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("client %d: %w", i, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// scrapeMetrics reads the unlabelled series of the host's admin
// listener at addr (host:port), with its access token.
func scrapeMetrics(addr, token string) (map[string]float64, error) {
	if addr == "" {
		return nil, errors.New("no admin listener")
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}
