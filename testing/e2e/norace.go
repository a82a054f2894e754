//go:build !race

package e2e

// raceEnabled reports whether this test binary was built with -race; Build
// then builds tether with -race too.
const raceEnabled = false
