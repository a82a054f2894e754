package main

import (
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

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host"
)

const pluginsUsage = `usage:
  tether plugins [list] [--json]          one line per plugin: name, kind, pid, uptime, restarts, state, version, connections
  tether plugins load transport:NAME=PATH[#sha256] [--listen ADDR]
                                          start another transport beside the running ones, serving ADDR
                                          (default unix:<state-dir>/NAME.sock; a TCP host:port is bound by the host)
  tether plugins unload NAME              stop an added transport: its sockets are closed with 1012,
                                          their sessions parked (resume them anywhere)
  tether plugins reload NAME [--plugin-path PATH[#sha256]]
                                          transport or notifier: swap in a fresh process (of PATH, run with
                                          no arguments; a notifier's pending notifications wait in the outbox);
                                          also restarts one marked failed; pty: start it again after a stop
  tether plugins stop pty                 stop the PTY plugin and every PTY (also when no host is running)

Every subcommand takes --state-dir (env TETHER_STATE_DIR; default: the one
tether serve uses) and talks to the host running there through its control
socket.
`

// pluginsCmd is `tether plugins`: it lists, reloads and stops the plugins
// of the host running on a state dir.
func pluginsCmd(args []string) int {
	fs := flag.NewFlagSet("tether plugins", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), pluginsUsage) }
	if helpAsked(args) {
		fs.SetOutput(os.Stdout)
	}
	stateDir := fs.String("state-dir", defaultStateDir(), "state dir of the running host")
	pluginPath := fs.String("plugin-path", "", "reload: the new plugin binary, PATH[#sha256]")
	asJSON := fs.Bool("json", false, "list: print the host's answer as JSON")
	listen := fs.String("listen", "", "load: the address the transport serves")
	timeout := fs.Duration("timeout", 60*time.Second, "how long to wait for the host")
	// Flags may come before, between or after the words.
	var words []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			fmt.Fprintln(os.Stderr, "tether plugins:", err)
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		words = append(words, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if err := parseFlags(fs, nil); err != nil { // TETHER_* for flags not given
		fmt.Fprintln(os.Stderr, "tether plugins:", err)
		return 2
	}
	if len(words) == 0 {
		words = []string{"list"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	switch words[0] {
	case "list":
		if len(words) != 1 {
			break
		}
		resp, err := host.Control(ctx, *stateDir, host.ControlRequest{Op: host.OpList})
		if err != nil {
			fmt.Fprintln(os.Stderr, "tether plugins:", err)
			return 1
		}
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(resp.Plugins)
			return 0
		}
		printPlugins(os.Stdout, resp.Plugins, time.Now())
		return 0
	case "reload":
		if len(words) != 2 {
			break
		}
		req := host.ControlRequest{Op: host.OpReload, Name: words[1]}
		if *pluginPath != "" {
			spec, err := pluginFile(*pluginPath)
			if err != nil {
				fmt.Fprintf(os.Stderr, "tether plugins: --plugin-path %q: %v\n", *pluginPath, err)
				return 2
			}
			req.Path, req.SHA256 = spec.Path, spec.SHA256
		}
		return control(ctx, *stateDir, req)
	case "load":
		if len(words) != 2 {
			break
		}
		req, err := loadRequest(words[1], *listen)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tether plugins: load:", err)
			return 2
		}
		return control(ctx, *stateDir, req)
	case "unload":
		if len(words) != 2 {
			break
		}
		return control(ctx, *stateDir, host.ControlRequest{Op: host.OpUnload, Name: words[1]})
	case "stop":
		if len(words) != 2 {
			break
		}
		return control(ctx, *stateDir, host.ControlRequest{Op: host.OpStop, Name: words[1]})
	}
	fmt.Fprint(os.Stderr, pluginsUsage)
	return 2
}

// control sends req to the host on stateDir and prints the plugins it
// answers with. A stop with no host running goes by the plugin's record.
func control(ctx context.Context, stateDir string, req host.ControlRequest) int {
	resp, err := host.Control(ctx, stateDir, req)
	if req.Op == host.OpStop && errors.Is(err, host.ErrNoHost) {
		return stopWithoutHost(ctx, stateDir, req.Name)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "tether plugins: %s %s: %v\n", req.Op, req.Name, err)
		return 1
	}
	printPlugins(os.Stdout, resp.Plugins, time.Now())
	return 0
}

// loadRequest parses transport:NAME=PATH[#sha256] into a load request
// (the path made absolute, so the host runs the same file).
func loadRequest(arg, listen string) (host.ControlRequest, error) {
	kindName, rest, ok := strings.Cut(arg, "=")
	kind, name, named := strings.Cut(kindName, ":")
	if !ok || !named || rest == "" {
		return host.ControlRequest{}, fmt.Errorf("%q: want transport:NAME=PATH[#sha256]", arg)
	}
	if kind != "transport" {
		return host.ControlRequest{}, fmt.Errorf("%q: only transports are loaded at runtime (want transport:NAME=PATH[#sha256])", arg)
	}
	if err := host.CheckTransportName(name); err != nil {
		return host.ControlRequest{}, err
	}
	spec, err := pluginFile(rest)
	if err != nil {
		return host.ControlRequest{}, fmt.Errorf("%q: %w", arg, err)
	}
	return host.ControlRequest{Op: host.OpLoad, Kind: kind, Name: name, Path: spec.Path, SHA256: spec.SHA256, Listen: listen}, nil
}

// stopWithoutHost stops a plugin a host left running on stateDir when no
// host runs there any more.
func stopWithoutHost(ctx context.Context, stateDir, name string) int {
	pid, stopped, err := host.StopRecordedPlugin(ctx, stateDir, name, zerolog.Nop())
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "tether plugins: stop %s: %v\n", name, err)
		return 1
	case stopped:
		fmt.Printf("no host is running on %s; stopped the %s plugin it left running (pid %d)\n", stateDir, name, pid)
	case pid != 0:
		fmt.Printf("no host is running on %s; the %s plugin it recorded (pid %d) is gone; record removed\n", stateDir, name, pid)
	default:
		fmt.Printf("no host is running on %s and no %s plugin is recorded there\n", stateDir, name)
	}
	return 0
}

// printPlugins prints one line per plugin under a header.
func printPlugins(w io.Writer, ps []host.PluginStatus, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tPID\tUPTIME\tRESTARTS\tSTATE\tVERSION\tCONNS\tNOTES")
	for _, p := range ps {
		pid, uptime, version := "-", "-", "-"
		if p.Pid != 0 {
			pid = strconv.Itoa(p.Pid)
		}
		if !p.Started.IsZero() {
			uptime = now.Sub(p.Started).Round(time.Second).String()
		}
		if p.Version != "" {
			version = p.Version
		}
		var notes []string
		if p.Kind == "backend" && p.Pid != 0 {
			notes = append(notes, fmt.Sprintf("ptys=%d", p.PTYs))
		}
		if p.Reattached {
			notes = append(notes, "reattached")
		}
		if p.Addr != "" {
			notes = append(notes, "addr="+p.Addr)
		}
		if p.LastError != "" {
			notes = append(notes, "last_error="+strconv.Quote(p.LastError))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\n",
			p.Name, p.Kind, pid, uptime, p.Restarts, p.State, version, p.Connections, strings.Join(notes, " "))
	}
	_ = tw.Flush()
}
