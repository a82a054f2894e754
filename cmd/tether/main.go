// Command tether is the tether host and its built-in plugins in one
// binary:
//
//	tether serve            run the host (see --help for flags)
//	tether sessions         list live and stored sessions of a running host
//	tether sessions tail    follow one session's events
//	tether prompt           submit a prompt and stream the answer
//	tether attach           join a PTY of a running host from this terminal
//	tether ptys             list the live PTYs of a running host
//	tether acp              the host's /acp endpoint on stdio, for editors
//	tether plugin ws        the built-in WebSocket transport plugin (run by the host)
//
// Every flag can also be set as TETHER_<NAME> (upper case, dashes as
// underscores), e.g. TETHER_LISTEN=127.0.0.1:0.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/tether-agent/tether/internal/umask"
)

// version is the tether version, reported in gateway.ready; release
// builds set it with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		usage(os.Stderr)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:])
	case "sessions":
		if len(args) > 1 && args[1] == "tail" {
			return sessionsTail(args[2:])
		}
		return sessions(args[1:])
	case "prompt":
		return prompt(args[1:])
	case "attach":
		return attach(args[1:])
	case "acp":
		return acpBridge(args[1:])
	case "ptys":
		return ptysCmd(args[1:])
	case "cluster":
		return clusterCmd(args[1:])
	case "plugin":
		return pluginMain(args[1:])
	case umask.Arg:
		// Hidden: how a PTY's shell or an agent gets the user's umask
		// rather than tether's 077 (internal/umask).
		return umask.Main(args[1:])
	case "plugins":
		return pluginsCmd(args[1:])
	case "token":
		return tokenCmd(args[1:])
	case "share":
		return shareCmd(args[1:])
	case "doctor":
		return doctor(args[1:])
	case "notify":
		return notifyCmd(args[1:], os.Stdout, os.Stderr)
	case "version", "--version", "-version":
		fmt.Println("tether", version)
		return 0
	case "help", "-h", "--help", "-help":
		usage(os.Stdout)
		return 0
	}
	fmt.Fprintf(os.Stderr, "tether: unknown command %q\n", args[0])
	usage(os.Stderr)
	return 2
}

// usage prints the commands to w: stdout when asked for, stderr after a
// mistake.
func usage(w io.Writer) {
	fmt.Fprint(w, `usage: tether <command> [flags]

commands:
  serve      run the host: the session table, the gateway and its plugins
  sessions   list the live and stored sessions of a running host ("sessions tail KEY" follows one)
  prompt     submit a prompt to a new or stored session and stream the answer
  attach     join a PTY of a running host from this terminal (ATTACH_TOKEN or --new)
  ptys       list the live PTYs of a running host (attach tokens: join one with attach)
  cluster    list the hosts of a running host's cluster ("cluster secret": make a cluster's secret)
  acp        the host's /acp endpoint on stdin/stdout: an editor's ACP agent command
  plugins    list, reload or stop the plugins of a running host (control socket)
  token      create, list or revoke scoped credentials (create --name N --scope S --ttl D)
  share      print a link to one terminal or chat, read-only with --view (share pty TOKEN | session KEY)
  doctor     check the state dir, database, plugins, disk, port and token file
  notify     "notify test": send a test notification through every notifier of a running host
  version    print the version

Run "tether <command> -h" for a command's flags. Every flag can also be set
in the environment as TETHER_<NAME>, e.g. TETHER_LISTEN.
`)
}
