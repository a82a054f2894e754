package main

import (
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
	"github.com/tether-agent/tether/plugins/ws/web"
)

// pluginMain runs a built-in plugin; the host re-executes its own binary
// as `tether plugin ws`. Plugins log JSON to stderr (stdout carries
// go-plugin's handshake); the host re-emits those lines.
func pluginMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: tether plugin ws|pty")
		return 2
	}
	log := zerolog.New(os.Stderr).Level(pluginLogLevel()).With().Timestamp().Logger()
	switch args[0] {
	case "ws":
		srv := ws.New(log)
		srv.Static = web.Handler() // the browser terminal at /
		// A transport must not outlive its host (it would keep the public
		// port): exit when the host is gone, even after a kill -9.
		go exitWithParent(log)
		contract.ServeTransport(srv)
		return 0
	case "pty":
		return ptyPluginMain()
	}
	fmt.Fprintf(os.Stderr, "tether plugin: unknown plugin %q (built in: ws, pty)\n", args[0])
	return 2
}

// pluginLogLevel is the least level a built-in plugin logs: the host's
// (contract.EnvPluginLogLevel), or every level when the variable is
// missing or not a level. A PTY plugin that outlives its host keeps the
// level it was started with.
func pluginLogLevel() zerolog.Level {
	l, err := zerolog.ParseLevel(os.Getenv(contract.EnvPluginLogLevel))
	if err != nil || l == zerolog.NoLevel {
		return zerolog.TraceLevel
	}
	return l
}

// exitWithParent exits the process once its parent (the host) is gone:
// the process is then reparented, so its parent pid changes.
func exitWithParent(log zerolog.Logger) {
	parent := os.Getppid()
	for range time.Tick(500 * time.Millisecond) {
		if os.Getppid() != parent {
			log.Warn().Int("host_pid", parent).Msg("host is gone; transport plugin exiting")
			os.Exit(0)
		}
	}
}
