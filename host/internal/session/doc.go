// Package session is tether's authoritative session table: the live
// sessions (a plain map under one mutex), their viewers, runs, event
// sequence and in-memory event ring, the journal that makes every event
// durable before any client is sent it, and the one teardown funnel.
//
// Nothing outside this package can touch a live session's fields or
// remove a binding. Callers hold a Binding (what their bind made: the
// session and its binding generation) and present it when they leave;
// every teardown — a viewer leaving, a reap timer, the idle sweep, an
// eviction, session.close, shutdown — goes through release, which asks
// the pure decide function what the caller's view allows and only then
// swaps the binding. A stale caller (another transport bound since it
// looked) can drop its own viewer, never close or reap the session.
//
// Ownership of a stored key is recorded in an ownership.Store (in memory on
// a single host) with revision-checked updates made outside the table
// lock: a bind is refused when the store refuses it, so a store shared by
// several hosts keeps one live session per key across all of them.
package session
