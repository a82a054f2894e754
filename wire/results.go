package wire

import "encoding/json"

// Params of the gateway's methods. A zero optional field is left out.

// CreateParams are the params of session.create.
type CreateParams struct {
	Cols              int    `json:"cols,omitempty"`
	Title             string `json:"title,omitempty"`
	CloseOnDisconnect bool   `json:"close_on_disconnect,omitempty"`
	// ParentSessionID is the stored key of the session to fork from.
	ParentSessionID string `json:"parent_session_id,omitempty"`
}

// BranchParams are the params of session.branch. SessionID is a stored
// key or a runtime id; the title defaults to the parent's.
type BranchParams struct {
	SessionID string `json:"session_id"`
	Title     string `json:"title,omitempty"`
	Cols      int    `json:"cols,omitempty"`
}

// ResumeParams are the params of session.resume. SessionID is a stored
// key or a session's exact title.
type ResumeParams struct {
	SessionID string `json:"session_id"`
	Cols      int    `json:"cols,omitempty"`
}

// SessionParams are the params of the methods that take only a runtime
// session id: session.activate, session.close, session.runs,
// session.interrupt.
type SessionParams struct {
	SessionID string `json:"session_id"`
}

// ListParams are the params of session.list.
type ListParams struct {
	Limit int `json:"limit,omitempty"`
}

// EventsSinceParams are the params of session.events.since.
type EventsSinceParams struct {
	SessionID string `json:"session_id"`
	LastSeen  uint64 `json:"last_seen"`
}

// SubmitParams are the params of prompt.submit.
type SubmitParams struct {
	SessionID string `json:"session_id"`
	Text      string `json:"text"`
	// Content is more of the prompt, after Text: a JSON array of ACP
	// content blocks (docs/PROTOCOL.md, prompt.submit); nil for none.
	Content json.RawMessage `json:"content,omitempty"`
}

// Results.

// Message is one row of a session's display history.
type Message struct {
	Role string `json:"role"` // RoleUser or RoleAssistant
	Text string `json:"text"`
	// Content is a prompt's ACP content blocks as sent, when it was more
	// than one plain text block (Text is then the text of its text
	// blocks).
	Content json.RawMessage `json:"content,omitempty"`
}

// Snapshot is the result of session.create, branch, resume and activate.
// Messages is the whole display history, the turn in flight included as
// far as it has streamed (Status StatusWorking). The first live event
// after it has seq LatestSeq+1.
type Snapshot struct {
	SessionID    string    `json:"session_id"`
	SessionKey   string    `json:"session_key"`
	Resumed      string    `json:"resumed,omitempty"`
	Title        string    `json:"title"`
	MessageCount int       `json:"message_count"`
	Messages     []Message `json:"messages"`
	Status       string    `json:"status"`
	Running      bool      `json:"running"`
	StartedAt    int64     `json:"started_at"`
	LatestSeq    uint64    `json:"latest_seq"`
	Epoch        string    `json:"epoch"`
	// PendingPermissions holds the permission.request payloads still open
	// (ACP agents only).
	PendingPermissions []json.RawMessage `json:"pending_permissions,omitempty"`
	// AgentContext is "reset" when an ACP agent could not load the
	// session and started it anew.
	AgentContext string `json:"agent_context,omitempty"`
}

// ActiveList is the result of session.active_list.
type ActiveList struct {
	Sessions []ActiveSession `json:"sessions"`
}

// ActiveSession is one live session (parked ones included), in creation
// order.
type ActiveSession struct {
	ID           string `json:"id"`
	SessionKey   string `json:"session_key"`
	Title        string `json:"title"`
	Status       string `json:"status"`
	MessageCount int    `json:"message_count"`
	StartedAt    int64  `json:"started_at"`
	LastActive   int64  `json:"last_active"`
	Viewers      int    `json:"viewers"`
	// Transports counts the viewers per transport name.
	Transports map[string]int `json:"transports,omitempty"`
}

// StoredList is the result of session.list.
type StoredList struct {
	Sessions []StoredSession `json:"sessions"`
}

// StoredSession is one stored session, newest first; ID is its stored key.
type StoredSession struct {
	ID           string `json:"id"`
	Title        string `json:"title"`
	StartedAt    int64  `json:"started_at"`
	EndedAt      *int64 `json:"ended_at"` // nil while it has not ended
	EndReason    string `json:"end_reason"`
	MessageCount int    `json:"message_count"`
	// LastActive is when the session was last active as stored: the
	// latest of StartedAt, EndedAt and its runs' start and end times.
	LastActive int64 `json:"last_active"`
	// LastRunBy names who started the session's latest run (the name of
	// the credential that submitted its prompt); omitted when it has no
	// run or none was recorded.
	LastRunBy string `json:"last_run_by,omitempty"`
}

// EventsSince is the result of session.events.since. Events holds the
// events with seq > last_seen when Truncated is false and Epoch is the one
// the client knew; otherwise the client redraws from a snapshot.
type EventsSince struct {
	Epoch     string  `json:"epoch"`
	Events    []Event `json:"events"`
	LatestSeq uint64  `json:"latest_seq"`
	Truncated bool    `json:"truncated"`
}

// SubmitResult is the result of prompt.submit.
type SubmitResult struct {
	Status string `json:"status"` // SubmitStreaming
	RunID  string `json:"run_id"`
}

// CloseResult is the result of session.close: false when the session was
// not live.
type CloseResult struct {
	Closed bool `json:"closed"`
}

// RunList is the result of session.runs.
type RunList struct {
	Runs []Run `json:"runs"`
}

// Run is one run of a session, oldest first.
type Run struct {
	RunID     string `json:"run_id"`
	Status    string `json:"status"` // RunRunning, RunComplete, RunInterrupted or RunFailed
	StartedAt int64  `json:"started_at"`
	EndedAt   *int64 `json:"ended_at"`
}

// InterruptResult is the result of session.interrupt.
type InterruptResult struct {
	Status string `json:"status"` // InterruptInterrupted or InterruptIdle
}

// Event payloads.

// Ready is the payload of gateway.ready.
type Ready struct {
	Version string `json:"version"`
	// Identity is who the connection's credential names and what it
	// may do (a page under a view credential shows itself read-only).
	Identity *Identity `json:"identity,omitempty"`
	// PromptCapabilities says which content blocks a prompt may hold
	// besides text and resource links (prompt.submit's content).
	PromptCapabilities PromptCapabilities `json:"prompt_capabilities"`
}

// PromptCapabilities are the configured agent's ACP prompt capabilities:
// image, audio and embedded resource blocks it takes.
type PromptCapabilities struct {
	Image           bool `json:"image"`
	Audio           bool `json:"audio"`
	EmbeddedContext bool `json:"embeddedContext"`
}

// Identity is a credential's name and scopes.
type Identity struct {
	Name   string   `json:"name"`
	Scopes []string `json:"scopes"`
}

// MessageStart is the payload of message.start.
type MessageStart struct {
	RunID string `json:"run_id"`
}

// MessageDelta is the payload of message.delta: the next piece of the
// answer.
type MessageDelta struct {
	Text string `json:"text"`
}

// MessageComplete is the payload of message.complete, which ends every
// run: Text is the whole answer as stored (for an interrupted run exactly
// what was streamed).
type MessageComplete struct {
	Text   string `json:"text"`
	Status string `json:"status"` // RunComplete, RunInterrupted or RunFailed
	// StopReason is the ACP agent's stop reason (ACP agents only).
	StopReason string `json:"stop_reason,omitempty"`
}

// ClusterHost is one host of a cluster, as cluster.hosts lists it.
type ClusterHost struct {
	ID     string `json:"id"`
	Listen string `json:"listen"`
	// Sessions and PTYs are what the host had live at its last
	// heartbeat.
	Sessions int `json:"sessions"`
	PTYs     int `json:"ptys"`
	// HeartbeatAgeMS is how long ago the answering host saw the host's
	// heartbeat, in milliseconds.
	HeartbeatAgeMS int64 `json:"heartbeat_age_ms"`
	// Alive: the heartbeat is within the cluster TTL.
	Alive bool `json:"alive"`
	// Self marks the answering host.
	Self bool `json:"self"`
}

// ClusterHosts is the result of cluster.hosts.
type ClusterHosts struct {
	// Cluster is false on a single host (not in a cluster).
	Cluster bool          `json:"cluster"`
	Hosts   []ClusterHost `json:"hosts"`
}

// Credential kinds (CredentialInfo.Kind).
const (
	CredentialToken = "token"      // a host's access token ("admin")
	CredentialMade  = "credential" // made with tether token create
	CredentialShare = "share"      // made with tether share
	CredentialPage  = "page"       // a browser's sign-in, made from another
)

// CredentialCreateParams are the params of credential.create.
type CredentialCreateParams struct {
	Name   string   `json:"name,omitempty"`
	Scopes []string `json:"scopes,omitempty"`
	// TTLSeconds is how long it lasts; 0: until revoked.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
	// Share makes a share link's credential: exactly one session or
	// PTY scope, and the answer's URL opens the page on it.
	Share bool `json:"share,omitempty"`
}

// CredentialInfo is a credential as credential.list shows it: never
// its secret.
type CredentialInfo struct {
	ID      string   `json:"id"`
	Name    string   `json:"name"`
	Kind    string   `json:"kind"`
	Scopes  []string `json:"scopes"`
	Created int64    `json:"created_at"`
	// Expires and LastUsed are Unix seconds; 0: never.
	Expires  int64 `json:"expires_at"`
	LastUsed int64 `json:"last_used"`
}

// CredentialCreated is the result of credential.create: the secret is
// shown this once.
type CredentialCreated struct {
	Credential CredentialInfo `json:"credential"`
	Secret     string         `json:"secret"`
	// URL opens the page with the credential (on the shared terminal or
	// chat for a share); empty when the host does not know its URL.
	URL string `json:"url,omitempty"`
}

// CredentialList is the result of credential.list.
type CredentialList struct {
	Credentials []CredentialInfo `json:"credentials"`
}

// CredentialRevokeParams are the params of credential.revoke.
type CredentialRevokeParams struct {
	// Credential is an ID or a name (a name revokes all of that name).
	Credential string `json:"credential"`
}

// CredentialRevoked is the result of credential.revoke.
type CredentialRevoked struct {
	Revoked []CredentialInfo `json:"revoked"`
}

// PushKey is the result of push.key.
type PushKey struct {
	// Key is the host's VAPID public key, base64url: the
	// applicationServerKey of pushManager.subscribe.
	Key string `json:"key"`
}

// PushKeys are a push subscription's keys, as the browser's
// PushSubscription.toJSON() gives them (base64url).
type PushKeys struct {
	P256dh string `json:"p256dh"`
	Auth   string `json:"auth"`
}

// PushSubscribeParams are the params of push.subscribe: a browser's
// PushSubscription.toJSON() (expirationTime is ignored).
type PushSubscribeParams struct {
	Endpoint       string   `json:"endpoint"`
	Keys           PushKeys `json:"keys"`
	ExpirationTime *int64   `json:"expirationTime,omitempty"`
}

// PushUnsubscribeParams are the params of push.unsubscribe.
type PushUnsubscribeParams struct {
	Endpoint string `json:"endpoint"`
}

// PushUnsubscribed is the result of push.unsubscribe.
type PushUnsubscribed struct {
	// Deleted is false when the caller had no such subscription.
	Deleted bool `json:"deleted"`
}
