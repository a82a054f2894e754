package main

// The in-process probe of tether's WebSocket transport: the plugins/ws
// package run in a process of its own, without go-plugin and gRPC, with a
// sink that admits every connection and greets it as the host would. It
// serves /memstats and /debug/pprof on a second listener, so that the
// idle-socket figure of the real plugin can be broken down into heap,
// goroutine stacks and what is merely not yet returned to the OS.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
)

// probeStats is what /memstats answers, after a forced GC.
type probeStats struct {
	HeapInuse, HeapIdle, HeapReleased, StackInuse, Sys uint64
	Goroutines                                         int
}

func runWSProbe(ln net.Listener, statsFile string) int {
	ln.Close() // the transport binds its own listener on the same address
	s := ws.New(zerolog.Nop())
	ctx := context.Background()
	resp, err := s.Start(ctx, contract.StartRequest{Listen: ln.Addr().String(), PingInterval: time.Hour, PeerTimeout: 2 * time.Hour})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() {
		_ = s.Link(ctx, func(ctx context.Context, evs []contract.Event) error {
			var cmds []contract.Command
			for _, e := range evs {
				if e.Kind == contract.EventOpened {
					cmds = append(cmds,
						contract.Command{Kind: contract.CommandAdmit, Conn: e.Conn},
						contract.Command{Kind: contract.CommandSend, Conn: e.Conn, Data: readyFrame})
				}
			}
			return s.Exec(ctx, cmds)
		})
	}()
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/memstats", func(w http.ResponseWriter, _ *http.Request) {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		debug.FreeOSMemory()
		_ = json.NewEncoder(w).Encode(probeStats{HeapInuse: ms.HeapInuse, HeapIdle: ms.HeapIdle, HeapReleased: ms.HeapReleased,
			StackInuse: ms.StackInuse, Sys: ms.Sys, Goroutines: runtime.NumGoroutine()})
	})
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.WriteFile(statsFile, []byte(admin.Addr().String()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = resp
	_ = http.Serve(admin, mux)
	return 0
}

func fetchProbeStats(adminAddr string) (probeStats, error) {
	var st probeStats
	resp, err := http.Get("http://" + adminAddr + "/memstats")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// fetchHeapProfile saves the probe's in-use heap profile to path.
func fetchHeapProfile(adminAddr, path string) error {
	resp, err := http.Get("http://" + adminAddr + "/debug/pprof/heap?gc=1")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.ReadFrom(resp.Body)
	return err
}
