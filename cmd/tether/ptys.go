package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tether-agent/tether/host"
)

const ptysUsage = `usage: tether ptys [--json] [--state-dir DIR]

Lists the live PTYs of the host running on the state dir, through its
control socket: attach token, pid, size, whether a writer is attached,
read-only viewers, age, how long it has been detached, and the command its
process runs. A terminal opened in the browser is one of them: join it
from here with "tether attach TOKEN" (the browser's tab is then detached,
4409), or watch it with "tether attach --view TOKEN".

An attach token is a capability: anyone who has it and the access token
can type into that shell. The control socket has mode 0600 in the 0700
state dir, so only the host's user (and root) can list them; do not paste
them where others can read them.

flags:
`

// ptyEntry is one line of `tether ptys --json`.
type ptyEntry struct {
	Token string `json:"token"`
	Pid   int    `json:"pid"`
	// Command is the argv of the PTY's process as the system shows it now
	// (/proc/PID/cmdline); empty when it cannot be read.
	Command []string `json:"command"`
	Cols    int      `json:"cols"`
	Rows    int      `json:"rows"`
	Writer  bool     `json:"writer"`
	Viewers int      `json:"viewers"`
	// Created is when the PTY started and AgeSeconds how long ago;
	// Detached is when its last writer left (absent while one is
	// attached).
	Created    time.Time `json:"created"`
	AgeSeconds int64     `json:"age_seconds"`
	Detached   time.Time `json:"detached,omitzero"`
}

// ptysCmd is `tether ptys`: it lists the live PTYs of the host running
// on a state dir.
func ptysCmd(args []string) int { return ptys(args, os.Stdout, os.Stderr) }

// ptys is ptysCmd writing to stdout and stderr (help asked for goes to
// os.Stdout).
func ptys(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tether ptys", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), ptysUsage)
		fs.PrintDefaults()
	}
	stateDir := fs.String("state-dir", defaultStateDir(), "state dir of the running host")
	asJSON := fs.Bool("json", false, "print a JSON array, one object per PTY")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the host")
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "tether ptys:", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tether ptys: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	resp, err := host.Control(ctx, *stateDir, host.ControlRequest{Op: host.OpPTYs})
	if err != nil {
		fmt.Fprintln(stderr, "tether ptys:", err)
		return 1
	}
	now := time.Now()
	entries := ptyEntries(resp.PTYs, now, procCommand)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(entries); err != nil {
			fmt.Fprintln(stderr, "tether ptys:", err)
			return 1
		}
		return 0
	}
	if err := printPTYs(stdout, entries, now); err != nil {
		fmt.Fprintln(stderr, "tether ptys:", err)
		return 1
	}
	return 0
}

// ptyEntries adds to the host's answer what this machine tells of each
// process (command reads a pid's argv) and the age at now.
func ptyEntries(ptys []host.PTYStatus, now time.Time, command func(pid int) []string) []ptyEntry {
	entries := make([]ptyEntry, 0, len(ptys))
	for _, p := range ptys {
		argv := command(p.Pid)
		if argv == nil {
			argv = []string{}
		}
		entries = append(entries, ptyEntry{
			Token: p.Token, Pid: p.Pid, Command: argv, Cols: p.Cols, Rows: p.Rows,
			Writer: p.Writer, Viewers: p.Viewers, Created: p.Created,
			AgeSeconds: int64(max(now.Sub(p.Created), 0) / time.Second), Detached: p.Detached,
		})
	}
	return entries
}

// printPTYs prints one line per PTY under a header, or a line saying
// there is none; ages are at now.
func printPTYs(w io.Writer, entries []ptyEntry, now time.Time) error {
	if len(entries) == 0 {
		_, err := fmt.Fprintln(w, "no live PTYs")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "TOKEN\tPID\tSIZE\tWRITER\tVIEWERS\tAGE\tDETACHED\tCOMMAND")
	for _, e := range entries {
		writer, detached := "yes", "-"
		if !e.Writer {
			writer = "no"
			if !e.Detached.IsZero() {
				detached = shortAge(now.Sub(e.Detached)) + " ago"
			}
		}
		cmd := "?"
		if len(e.Command) > 0 {
			cmd = shellJoin(e.Command)
		}
		fmt.Fprintf(tw, "%s\t%d\t%dx%d\t%s\t%d\t%s\t%s\t%s\n",
			e.Token, e.Pid, e.Cols, e.Rows, writer, e.Viewers, shortAge(now.Sub(e.Created)), detached, cmd)
	}
	return tw.Flush()
}

// shortAge formats d to the second, "0s" at least.
func shortAge(d time.Duration) string {
	return max(d, 0).Truncate(time.Second).String()
}

// procCommand reads the argv of process pid from /proc (nil when it
// cannot: gone, a zombie, another user's without the right).
func procCommand(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(string(bytes.TrimSuffix(b, []byte{0})), "\x00")
}

// shellJoin joins argv into one line a POSIX shell splits back into the
// same words: a word with anything but letters, digits and -_./:=@%+, is
// single-quoted.
func shellJoin(argv []string) string {
	words := make([]string, len(argv))
	for i, a := range argv {
		words[i] = shellQuote(a)
	}
	return strings.Join(words, " ")
}

func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_./:=@%+,", c)) {
			return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
	}
	return s
}
