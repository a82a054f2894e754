package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// strList is a repeatable string flag.
type strList []string

func (l *strList) String() string { return strings.Join(*l, ",") }

// Set implements flag.Value.
func (l *strList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// envName is the environment variable of a flag: TETHER_ + upper case,
// dashes as underscores.
func envName(flagName string) string {
	return "TETHER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseFlags parses args, then fills every flag not given on the command
// line from its TETHER_<NAME> variable. A repeatable flag's variable may
// hold several values separated by commas.
//
// Help asked for (-h, --help) goes to stdout and the caller exits 0 on
// flag.ErrHelp; errors go to stderr.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if helpAsked(args) {
		fs.SetOutput(os.Stdout)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok {
			return
		}
		if _, repeat := f.Value.(*strList); repeat {
			for _, part := range strings.Split(v, ",") {
				if part = strings.TrimSpace(part); part != "" {
					if serr := f.Value.Set(part); serr != nil {
						err = fmt.Errorf("%s: %w", envName(f.Name), serr)
					}
				}
			}
			return
		}
		if serr := f.Value.Set(v); serr != nil {
			err = fmt.Errorf("%s=%q: %w", envName(f.Name), v, serr)
		}
	})
	return err
}

// helpAsked reports whether args ask for help (-h, --help) before "--".
func helpAsked(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			return true
		}
	}
	return false
}
