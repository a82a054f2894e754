package acpgw

import (
	"context"
	"time"

	"github.com/coder/acp-go-sdk"

	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/wire"
)

// SetCredentials gives the endpoint the host's credential book: each
// call is checked against its connection's credential's current scopes.
// Call it before the first connection.
func (g *Gateway) SetCredentials(b *access.Book) { g.book = b }

// can reports whether the connection reaches the stored session key, as
// its writer when write: by its credential's scopes or because it made
// the session.
func (c *conn) can(key string, write bool) bool {
	if access.Can(access.ScopesOf(c.g.book, c.who), access.ScopeSession, key, write) {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.created[key]
}

// canCreate reports whether the connection's credential may make
// sessions.
func (c *conn) canCreate() bool { return access.CanCreate(access.ScopesOf(c.g.book, c.who)) }

// forbid closes the connection with 4403 (a call outside its
// credential's scope; nothing was done) and returns the call's error.
func (c *conn) forbid(method string) error {
	c.log.Debug().Str("method", method).Str("credential", c.who.Name).Msg("acp call outside the credential's scope")
	c.closeWith(wire.CloseForbidden, access.ErrForbidden.Error())
	return &acp.RequestError{Code: wire.CodeForbidden, Message: access.ErrForbidden.Error()}
}

// madeSession records that the connection made the session key: it
// reaches it at once, and its credential (not admin) is granted it.
func (c *conn) madeSession(key string) {
	scopes := access.ScopesOf(c.g.book, c.who)
	if access.IsAdmin(scopes) {
		return
	}
	c.mu.Lock()
	if c.created == nil {
		c.created = make(map[string]bool)
	}
	c.created[key] = true
	c.mu.Unlock()
	if c.g.book == nil || c.who.Credential == "" {
		return
	}
	ctx, cancel := context.WithTimeout(c.g.ctx, 10*time.Second)
	defer cancel()
	if err := c.g.book.Grant(ctx, c.who.Credential, access.SessionScope(key, false)); err != nil {
		c.log.Warn().Err(err).Str("session_key", key).Msg("the session this credential created is reachable on this connection only")
	}
}
