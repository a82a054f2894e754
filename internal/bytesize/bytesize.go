// Package bytesize parses and prints the byte sizes of tether's flags
// ("4096", "64KiB", "1MiB", "2GiB"; docs/PROTOCOL.md and the --pty-buffer
// flag of `tether serve`). The tether binary and the benchmarks share it,
// so a size means the same on both sides.
package bytesize

import (
	"fmt"
	"strconv"
	"strings"
)

// units are the suffixes Parse accepts, largest first.
var units = []struct {
	suffix string
	mult   int64
}{
	{"GiB", 1 << 30},
	{"MiB", 1 << 20},
	{"KiB", 1 << 10},
}

// Parse parses s as bytes ("4096") or a whole number with a KiB, MiB or
// GiB suffix ("64KiB") and checks that the result is from least to most
// bytes.
func Parse(s string, least, most int64) (int64, error) {
	mult := int64(1)
	num := s
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			mult, num = u.mult, n
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > most/mult {
		return 0, fmt.Errorf("size %q: want bytes, or a number with KiB, MiB or GiB, up to %s", s, Format(most))
	}
	if n*mult < least {
		return 0, fmt.Errorf("size %q: at least %s", s, Format(least))
	}
	return n * mult, nil
}

// Format prints n with the largest suffix that divides it ("1MiB",
// "1536KiB"), or as plain bytes ("1000").
func Format(n int64) string {
	for _, u := range units {
		if n > 0 && n%u.mult == 0 {
			return fmt.Sprintf("%d%s", n/u.mult, u.suffix)
		}
	}
	return strconv.FormatInt(n, 10)
}
