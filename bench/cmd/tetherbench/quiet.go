package main

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// cpuBusy returns the fraction of all CPUs busy over d (from /proc/stat),
// whoever uses them: this is a shared machine, and other people's tests
// running beside the benchmark move its figures.
func cpuBusy(d time.Duration) float64 {
	read := func() (busy, total float64) {
		b, err := os.ReadFile("/proc/stat")
		if err != nil {
			return 0, 0
		}
		line := strings.SplitN(string(b), "\n", 2)[0]
		f := strings.Fields(line)
		for i, v := range f[1:] {
			x, _ := strconv.ParseFloat(v, 64)
			total += x
			if i != 3 && i != 4 { // idle, iowait
				busy += x
			}
		}
		return busy, total
	}
	b0, t0 := read()
	time.Sleep(d)
	b1, t1 := read()
	if t1 <= t0 {
		return 0
	}
	return (b1 - b0) / (t1 - t0)
}

// waitQuiet waits, at most max, for the machine to be less than 15% busy
// over half a second, and returns how busy it was when it gave up or went
// on.
func waitQuiet(max time.Duration) float64 {
	deadline := time.Now().Add(max)
	for {
		b := cpuBusy(500 * time.Millisecond)
		if b < 0.15 || time.Now().After(deadline) {
			return b
		}
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
