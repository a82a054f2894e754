package e2e

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// SumMetric returns the sum of the samples of the metric called name in a
// Prometheus text exposition whose labels include every "key=value" pair in
// labels. Samples of other names (name_bucket, name_sum, ...) are not
// included: ask for them by their own name. It returns 0 when no sample
// matches, and an error for a malformed label pair or a malformed sample
// line of that name.
func SumMetric(text, name string, labels ...string) (float64, error) {
	want := make(map[string]string, len(labels))
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return 0, fmt.Errorf("label %q: want key=value", l)
		}
		want[k] = v
	}
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		end := strings.IndexAny(line, "{ \t")
		if end < 0 || line[:end] != name {
			continue
		}
		got, value, err := parseSample(line[end:])
		if err != nil {
			return 0, fmt.Errorf("sample %q: %w", line, err)
		}
		if matchLabels(got, want) {
			sum += value
		}
	}
	return sum, nil
}

// HasSample reports whether a Prometheus text exposition has a sample
// line of the metric called name whose labels include every "key=value"
// pair in labels, whatever its value: unlike SumMetric, which says 0 for
// a series that is not there, it tells a series at 0 from a missing one.
// It returns an error for a malformed label pair or a malformed sample
// line of that name.
func HasSample(text, name string, labels ...string) (bool, error) {
	want := make(map[string]string, len(labels))
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return false, fmt.Errorf("label %q: want key=value", l)
		}
		want[k] = v
	}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		end := strings.IndexAny(line, "{ \t")
		if end < 0 || line[:end] != name {
			continue
		}
		got, _, err := parseSample(line[end:])
		if err != nil {
			return false, fmt.Errorf("sample %q: %w", line, err)
		}
		if matchLabels(got, want) {
			return true, nil
		}
	}
	return false, nil
}

func matchLabels(got, want map[string]string) bool {
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			return false
		}
	}
	return true
}

// parseSample parses what follows a sample's metric name: optional labels in
// braces, the value, an optional timestamp.
func parseSample(s string) (map[string]string, float64, error) {
	labels := map[string]string{}
	if strings.HasPrefix(s, "{") {
		var err error
		if s, err = parseLabels(s[1:], labels); err != nil {
			return nil, 0, err
		}
	}
	fields := strings.Fields(s)
	if len(fields) == 0 || len(fields) > 2 {
		return nil, 0, errors.New("want a value and at most a timestamp")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return nil, 0, err
	}
	return labels, v, nil
}

// parseLabels parses `k="v",...}` into labels and returns what follows the
// closing brace.
func parseLabels(s string, labels map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, " \t")
		if strings.HasPrefix(s, "}") {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return "", errors.New("label without =")
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t")
		if !strings.HasPrefix(s, `"`) {
			return "", fmt.Errorf("label %s: value not quoted", key)
		}
		var v strings.Builder
		i := 1
		for ; i < len(s) && s[i] != '"'; i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					c = '\n'
				default:
					c = s[i] // \\ and \"
				}
			}
			v.WriteByte(c)
		}
		if i >= len(s) {
			return "", fmt.Errorf("label %s: unterminated value", key)
		}
		labels[key] = v.String()
		s = strings.TrimLeft(s[i+1:], " \t")
		if strings.HasPrefix(s, ",") {
			s = s[1:]
		} else if !strings.HasPrefix(s, "}") {
			return "", fmt.Errorf("label %s: want , or }", key)
		}
	}
}
