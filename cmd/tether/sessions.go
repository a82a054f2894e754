package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"
)

// sessions lists the live and stored sessions of a running host through
// its JSON-RPC gateway.
func sessions(args []string) int {
	fs := flag.NewFlagSet("tether sessions", flag.ContinueOnError)
	tf := addTokenFlags(fs)
	limit := fs.Int("limit", 20, "stored sessions to list at most")
	asJSON := fs.Bool("json", false, "print {\"live\": [...], \"stored\": [...]} as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tether sessions [--json] [--url U | --state-dir DIR] [--limit N]
       tether sessions tail [--json] KEY

Lists the live and the stored sessions of a running host; "tail KEY"
follows one (see tether sessions tail --help). The host is --url, else
the one serving --state-dir (it records its address there), else
http://127.0.0.1:7717. The access token comes from TETHER_TOKEN, or from
the host's token file (<state-dir>/token) when the host runs on this
machine as this user.

flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "tether sessions:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := tf.dial(ctx, "tether sessions")
	if c == nil {
		return 1
	}
	defer c.Close()

	active, err := c.ActiveList(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether sessions:", err)
		return 1
	}
	stored, err := c.List(ctx, *limit)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether sessions:", err)
		return 1
	}
	if *asJSON {
		b, err := json.MarshalIndent(map[string]any{"live": active, "stored": stored}, "", "  ")
		if err != nil {
			return 1
		}
		fmt.Println(string(b))
		return 0
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "LIVE\tKEY\tTITLE\tSTATUS\tMESSAGES\tVIEWERS")
	for _, s := range active {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\n", s.ID, s.SessionKey, s.Title, s.Status, s.MessageCount, s.Viewers)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "STORED\tTITLE\tSTARTED\tLAST ACTIVE\tLAST RUN BY\tENDED\tMESSAGES")
	for _, s := range stored {
		ended := "-"
		if s.EndedAt != nil {
			ended = time.Unix(*s.EndedAt, 0).Format(time.DateTime) + " (" + s.EndReason + ")"
		}
		last := "-"
		if s.LastActive > 0 {
			last = time.Unix(s.LastActive, 0).Format(time.DateTime)
		}
		by := s.LastRunBy
		if by == "" {
			by = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", s.ID, s.Title, time.Unix(s.StartedAt, 0).Format(time.DateTime), last, by, ended, s.MessageCount)
	}
	if err := w.Flush(); err != nil {
		return 1
	}
	return 0
}
