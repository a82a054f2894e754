// Package supervise runs the host's plugin processes: it starts them as
// go-plugin subprocesses (checksum-verified, handshake-bounded, stderr
// re-emitted through the host's logger), keeps each one running on one
// supervisor loop — activate, serve, count a crash, restart with capped
// exponential backoff, mark failed past a limit — and adds what differs
// per kind: a Transport links its process to the endpoints and swaps it
// for a fresh one on reload, sharing the host's listener; the Backend (the
// PTY plugin) outlives the host and is reattached by the next one through
// a reattach record whose liveness a small pure function decides.
// Transports is the set of transport supervisors, loaded and unloaded at
// runtime.
package supervise
