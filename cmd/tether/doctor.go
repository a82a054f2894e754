package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/tether-agent/tether/host"
)

// doctor checks the machine and the state dir a host runs on and says
// what is wrong and how to fix it; it exits 1 when something is.
func doctor(args []string) int {
	fs := flag.NewFlagSet("tether doctor", flag.ContinueOnError)
	stateDir := fs.String("state-dir", defaultStateDir(), "the state dir to check")
	tokenFile := fs.String("token-file", "", "the token file to check (default <state-dir>/token)")
	listen := fs.String("listen", "127.0.0.1:7717", "the address tether serve would listen on")
	asJSON := fs.Bool("json", false, "print the findings as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tether doctor [--json] [--state-dir DIR] [--listen ADDR]

Checks the state dir, the running host, the database, the PTY plugin's
record, free disk, the port and the token file; changes nothing. Exits 1
when it finds a problem.

flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "tether doctor:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	found := host.Diagnose(ctx, host.DoctorConfig{StateDir: *stateDir, TokenFile: *tokenFile, Listen: *listen})
	bad := 0
	for _, f := range found {
		if !f.OK {
			bad++
		}
	}
	if *asJSON {
		b, _ := json.MarshalIndent(found, "", "  ")
		fmt.Println(string(b))
	} else {
		for _, f := range found {
			mark := "ok  "
			if !f.OK {
				mark = "FAIL"
			}
			fmt.Printf("%s  %-11s %s\n", mark, f.Check, f.Detail)
			if !f.OK && f.Fix != "" {
				fmt.Printf("      %-11s fix: %s\n", "", f.Fix)
			}
		}
		if bad == 0 {
			fmt.Println("no problem found")
		} else {
			fmt.Printf("%d problem(s) found\n", bad)
		}
	}
	if bad > 0 {
		return 1
	}
	return 0
}
