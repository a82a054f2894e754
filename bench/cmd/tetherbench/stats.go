package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// percentile returns the p-quantile (0 < p ≤ 1) of xs by the nearest-rank
// method; xs need not be sorted. It returns NaN for no samples.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// spread is benchstat's "±": the largest distance of a sample from the
// median, as a fraction of the median.
func spread(xs []float64) float64 {
	m := median(xs)
	if len(xs) < 2 || m == 0 || math.IsNaN(m) {
		return 0
	}
	d := 0.0
	for _, x := range xs {
		d = max(d, math.Abs(x-m))
	}
	return d / math.Abs(m)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func durationsMS(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = ms(d)
	}
	return out
}

// sample is one metric measured once per repetition.
type sample struct {
	xs []float64
}

func (s *sample) add(x float64) { s.xs = append(s.xs, x) }

// cell formats the median and spread of s with unit.
func (s *sample) cell(unit string) string {
	if s == nil || len(s.xs) == 0 {
		return "—"
	}
	m := median(s.xs)
	return fmt.Sprintf("%s %s ± %.0f%%", num(m), unit, 100*spread(s.xs))
}

func num(x float64) string {
	switch a := math.Abs(x); {
	case math.IsNaN(x):
		return "NaN"
	case a >= 1000:
		return fmt.Sprintf("%.0f", x)
	case a >= 100:
		return fmt.Sprintf("%.1f", x)
	case a >= 10:
		return fmt.Sprintf("%.2f", x)
	case a >= 1:
		return fmt.Sprintf("%.3f", x)
	default:
		return fmt.Sprintf("%.4f", x)
	}
}

// result is one line of the final table.
type result struct {
	row      string // e.g. "pty-stream 256MiB"
	metric   string // e.g. "MiB/s"
	tether   string
	baseline string // the baseline's figure, or ""
	ratio    string // tether/baseline per repetition, median ± spread
	target   string
	met      string // "yes", "NO", or ""
	n        int
}

// report collects results and notes.
type report struct {
	results []result
	notes   []string
}

func (r *report) add(res result) { r.results = append(r.results, res) }

func (r *report) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "NO"
}

// write prints the table, benchstat-like: one line per metric, columns
// aligned, then the notes.
func (r *report) write(w io.Writer) {
	head := []string{"row", "metric", "tether", "baseline", "ratio (same run)", "target", "met", "n"}
	rows := [][]string{head}
	for _, x := range r.results {
		n := ""
		if x.n > 0 {
			n = fmt.Sprint(x.n)
		}
		rows = append(rows, []string{x.row, x.metric, x.tether, dash(x.baseline), dash(x.ratio), dash(x.target), dash(x.met), n})
	}
	width := make([]int, len(head))
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	for k, row := range rows {
		var b strings.Builder
		for i, c := range row {
			b.WriteString(c)
			if i < len(row)-1 {
				b.WriteString(strings.Repeat(" ", width[i]-len([]rune(c))+2))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
		if k == 0 {
			fmt.Fprintln(w, strings.Repeat("-", len([]rune(b.String()))))
		}
	}
	if len(r.notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range r.notes {
			fmt.Fprintln(w, "note:", n)
		}
	}
}

func dash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}
