package client

import (
	"context"
	"encoding/json"

	"github.com/tether-agent/tether/wire"
)

// Create is session.create: a new live session viewed by this connection.
func (c *Conn) Create(ctx context.Context, p wire.CreateParams) (wire.Snapshot, error) {
	var s wire.Snapshot
	err := c.Call(ctx, wire.MethodCreate, p, &s)
	return s, err
}

// Branch is session.branch: a new live session forked from p.SessionID (a
// stored key or a runtime id).
func (c *Conn) Branch(ctx context.Context, p wire.BranchParams) (wire.Snapshot, error) {
	var s wire.Snapshot
	err := c.Call(ctx, wire.MethodBranch, p, &s)
	return s, err
}

// Resume is session.resume: the live session of a stored key (or exact
// title), rebuilt from storage when it is not live, viewed by this
// connection. wire.CodeStoredNotFound asks for a retry when the session
// was just released.
func (c *Conn) Resume(ctx context.Context, p wire.ResumeParams) (wire.Snapshot, error) {
	var s wire.Snapshot
	err := c.Call(ctx, wire.MethodResume, p, &s)
	return s, err
}

// Activate is session.activate: this connection views the live session
// sessionID too.
func (c *Conn) Activate(ctx context.Context, sessionID string) (wire.Snapshot, error) {
	var s wire.Snapshot
	err := c.Call(ctx, wire.MethodActivate, wire.SessionParams{SessionID: sessionID}, &s)
	return s, err
}

// CloseSession is session.close: it ends the live session sessionID and
// reports whether it was live.
func (c *Conn) CloseSession(ctx context.Context, sessionID string) (bool, error) {
	var r wire.CloseResult
	err := c.Call(ctx, wire.MethodClose, wire.SessionParams{SessionID: sessionID}, &r)
	return r.Closed, err
}

// ActiveList is session.active_list: the live sessions in creation
// order, parked ones included.
func (c *Conn) ActiveList(ctx context.Context) ([]wire.ActiveSession, error) {
	var r wire.ActiveList
	err := c.Call(ctx, wire.MethodActiveList, nil, &r)
	return r.Sessions, err
}

// List is session.list: stored sessions, newest first, at most limit (0:
// the host's default).
func (c *Conn) List(ctx context.Context, limit int) ([]wire.StoredSession, error) {
	var r wire.StoredList
	err := c.Call(ctx, wire.MethodList, wire.ListParams{Limit: limit}, &r)
	return r.Sessions, err
}

// EventsSince is session.events.since: the events of the live session
// sessionID after seq lastSeen.
func (c *Conn) EventsSince(ctx context.Context, sessionID string, lastSeen uint64) (wire.EventsSince, error) {
	var r wire.EventsSince
	err := c.Call(ctx, wire.MethodEventsSince, wire.EventsSinceParams{SessionID: sessionID, LastSeen: lastSeen}, &r)
	return r, err
}

// Submit is prompt.submit: it starts a run answering text; the answer
// streams as message.start, message.delta… and one message.complete.
func (c *Conn) Submit(ctx context.Context, sessionID, text string) (wire.SubmitResult, error) {
	var r wire.SubmitResult
	err := c.Call(ctx, wire.MethodSubmit, wire.SubmitParams{SessionID: sessionID, Text: text}, &r)
	return r, err
}

// SubmitContent is Submit of a prompt with content blocks after its text
// (a JSON array of ACP content blocks the agent takes: text,
// resource_link, and image, audio, resource where gateway.ready's
// prompt_capabilities say so).
func (c *Conn) SubmitContent(ctx context.Context, sessionID, text string, content json.RawMessage) (wire.SubmitResult, error) {
	var r wire.SubmitResult
	err := c.Call(ctx, wire.MethodSubmit, wire.SubmitParams{SessionID: sessionID, Text: text, Content: content}, &r)
	return r, err
}

// Runs is session.runs: the session's runs, oldest first.
func (c *Conn) Runs(ctx context.Context, sessionID string) ([]wire.Run, error) {
	var r wire.RunList
	err := c.Call(ctx, wire.MethodRuns, wire.SessionParams{SessionID: sessionID}, &r)
	return r.Runs, err
}

// Interrupt is session.interrupt: it reports whether a run was
// interrupted (false: the session was idle).
func (c *Conn) Interrupt(ctx context.Context, sessionID string) (bool, error) {
	var r wire.InterruptResult
	err := c.Call(ctx, wire.MethodInterrupt, wire.SessionParams{SessionID: sessionID}, &r)
	return r.Status == wire.InterruptInterrupted, err
}

// ClusterHosts lists the hosts of the host's cluster (cluster.hosts).
func (c *Conn) ClusterHosts(ctx context.Context) (wire.ClusterHosts, error) {
	var r wire.ClusterHosts
	err := c.Call(ctx, wire.MethodClusterHosts, struct{}{}, &r)
	return r, err
}

// CredentialCreate makes a scoped credential (credential.create; the
// access token only). The answer holds its secret, shown this once.
func (c *Conn) CredentialCreate(ctx context.Context, p wire.CredentialCreateParams) (wire.CredentialCreated, error) {
	var r wire.CredentialCreated
	err := c.Call(ctx, wire.MethodCredentialCreate, p, &r)
	return r, err
}

// CredentialList lists the host's credentials, never their secrets
// (credential.list).
func (c *Conn) CredentialList(ctx context.Context) ([]wire.CredentialInfo, error) {
	var r wire.CredentialList
	err := c.Call(ctx, wire.MethodCredentialList, struct{}{}, &r)
	return r.Credentials, err
}

// CredentialRevoke revokes the credentials of an ID or a name
// (credential.revoke): every socket opened with them is closed.
func (c *Conn) CredentialRevoke(ctx context.Context, idOrName string) ([]wire.CredentialInfo, error) {
	var r wire.CredentialRevoked
	err := c.Call(ctx, wire.MethodCredentialRevoke, wire.CredentialRevokeParams{Credential: idOrName}, &r)
	return r.Revoked, err
}
