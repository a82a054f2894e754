package wire

// Endpoint paths of a tether host.
const (
	PathRPC    = "/api/ws"  // JSON-RPC gateway
	PathPTY    = "/api/pty" // PTY byte stream
	PathACP    = "/acp"     // Agent Client Protocol
	PathHealth = "/healthz" // answers 200 "ok"
)

// JSONRPCVersion is the jsonrpc member of every message.
const JSONRPCVersion = "2.0"

// MethodEvent is the method of the notifications that carry server events.
const MethodEvent = "event"

// Gateway methods.
const (
	MethodCreate            = "session.create"
	MethodBranch            = "session.branch"
	MethodResume            = "session.resume"
	MethodActivate          = "session.activate"
	MethodClose             = "session.close"
	MethodActiveList        = "session.active_list"
	MethodList              = "session.list"
	MethodEventsSince       = "session.events.since"
	MethodSubmit            = "prompt.submit"
	MethodRuns              = "session.runs"
	MethodInterrupt         = "session.interrupt"
	MethodPermissionRespond = "permission.respond"
	// MethodClusterHosts lists the hosts of a cluster (tether cluster);
	// a single host answers with itself alone.
	MethodClusterHosts = "cluster.hosts"
	// MethodCredentialCreate, MethodCredentialList and
	// MethodCredentialRevoke make, list and revoke the host's scoped
	// credentials (tether token, tether share); admin only.
	MethodCredentialCreate = "credential.create"
	MethodCredentialList   = "credential.list"
	MethodCredentialRevoke = "credential.revoke"
	// MethodPushKey, MethodPushSubscribe and MethodPushUnsubscribe are
	// the page's Web Push: the host's VAPID public key, and storing or
	// deleting a browser's subscription (the caller's credential's).
	MethodPushKey         = "push.key"
	MethodPushSubscribe   = "push.subscribe"
	MethodPushUnsubscribe = "push.unsubscribe"
)

// Server event types.
const (
	EventReady              = "gateway.ready"
	EventMessageStart       = "message.start"
	EventMessageDelta       = "message.delta"
	EventMessageComplete    = "message.complete"
	EventACPUpdate          = "acp.update"
	EventPermissionRequest  = "permission.request"
	EventPermissionResolved = "permission.resolved"
	// EventSessionClosed is a session's last event: session.close, by
	// whom.
	EventSessionClosed = "session.closed"
)

// Message roles.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// Session statuses (snapshots and session.active_list).
const (
	StatusIdle    = "idle"
	StatusWorking = "working"
)

// Run statuses (session.runs and message.complete).
const (
	RunRunning     = "running"
	RunComplete    = "complete"
	RunInterrupted = "interrupted"
	RunFailed      = "failed"
)

// Results of prompt.submit and session.interrupt.
const (
	SubmitStreaming      = "streaming"
	InterruptInterrupted = "interrupted"
	InterruptIdle        = "idle"
)

// End reasons of a stored session; the first one recorded wins.
const (
	EndClosed       = "closed"
	EndDisconnected = "disconnected"
	EndOrphanReap   = "orphan_reap"
	EndIdleReap     = "idle_reap"
	EndEvicted      = "evicted"
	EndShutdown     = "shutdown"
)
