// Package rpc is the JSON-RPC 2.0 gateway of /api/ws: it decodes each
// text frame once, type-checks params before any lookup, serves every
// method over the session table's exported API from one method table
// (cheap in-memory calls inline on the link's goroutine, everything that
// may wait on a per-connection worker), maps the table's errors to the
// protocol's codes, and keeps, per connection, the bindings its binds
// gave it so that its close leaves through the table's teardown funnel.
package rpc
