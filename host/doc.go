// Package host is the wiring of tether's authoritative side: Run starts
// the parts listed in parts.go in order and stops them in reverse under
// one deadline (lifecycle.go); the package also
// keeps the state dir (its lock and socket dir), the control socket that
// `tether plugins` and `tether ptys` talk to (Control), and the checks of
// `tether doctor` (Diagnose).
//
// The parts are packages of their own, kept apart by the compiler:
//
//   - host/internal/session: the session table and its one
//     compare-and-swap teardown funnel;
//   - host/internal/rpc: the /api/ws JSON-RPC gateway;
//   - host/internal/acpgw: the /acp endpoint; host/internal/acpagent:
//     --agent acp;
//   - host/internal/link: the host's end of a transport plugin process;
//     host/internal/access: its access checks;
//   - host/internal/ptyroute: /api/pty;
//   - host/internal/supervise: the plugin processes;
//   - host/internal/ownership: the ownership store the table records
//     its bindings in;
//   - host/internal/cluster: with Config.Cluster (tether serve
//     --cluster), the host's membership of a cluster on NATS JetStream —
//     the ownership store and the stored sessions there, heartbeats, and
//     the relay of connections to the host that has their session or
//     PTY (cluster.go wires it);
//   - host/internal/metrics: the Prometheus registry;
//   - host/agent: the agents; host/store: the SQLite database.
//
// The host never imports a plugin: it talks to them through the contract
// package, over go-plugin subprocesses in the product.
package host
