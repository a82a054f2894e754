//go:build !race

package main

// raceEnabled: the test binary has -race, and builds the example with it.
const raceEnabled = false
