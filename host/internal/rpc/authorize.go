package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// need is what a method needs of the caller's credential
// (docs/PROTOCOL.md, "Credentials and scopes"). Every method of the
// table names one; a call outside it is answered 4030 and changes
// nothing.
type need uint8

const (
	needUnset  need = iota // a method that forgot: init refuses it
	needAdmin              // the host's own business (cluster.hosts, credential.*)
	needCreate             // admin or new; a parent_session_id needs its view too
	needBranch             // admin or new, and the view of the branched session
	needResume             // the view of the session named by key or title
	needView               // the view of the live session session_id
	needWrite              // the writer's scope of the live session session_id
	needAnyone             // any credential: the answer is filtered to its scope
)

// errForbidden is the answer to a call outside the credential's scope.
var errForbidden = errorf(wire.CodeForbidden, "%s", access.ErrForbidden.Error())

// scopes returns what the connection's credential may do now: the
// book's current scopes for a stored credential (so a grant or a
// revocation counts at once; none once it is revoked), else those its
// identity carries (a reverse proxy's user).
func (c *conn) scopes() []string { return access.ScopesOf(c.gw.book, c.who) }

// can reports whether the connection reaches the stored session key,
// as its writer when write: by its credential's scopes or because this
// connection created it.
func (c *conn) can(scopes []string, key string, write bool) bool {
	if access.Can(scopes, access.ScopeSession, key, write) {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.created[key]
}

// authorize checks the call of a method needing n with params p against
// the connection's scopes. A resume by title of a credential that is
// not admin is rewritten to the key it was checked against, so that the
// session served is the one allowed. An error is the call's answer.
func (c *conn) authorize(n need, p params) error {
	scopes := c.scopes()
	if access.IsAdmin(scopes) {
		return nil
	}
	switch n {
	case needAnyone:
		return nil
	case needAdmin:
		return errForbidden
	case needCreate:
		if !access.CanCreate(scopes) {
			return errForbidden
		}
		parent, err := p.str("parent_session_id")
		if err != nil || parent == "" {
			return nil // the handler answers a bad parent
		}
		if !c.can(scopes, parent, false) {
			return errForbidden
		}
		return nil
	case needBranch:
		if !access.CanCreate(scopes) {
			return errForbidden
		}
		return c.authorizeLive(scopes, p, false, true)
	case needResume:
		sid, err := p.sessionID()
		if err != nil {
			return nil // the handler answers it
		}
		key := sid
		if !store.ValidKey(sid) {
			var ferr error
			if key, ferr = c.keyOfTitle(sid); ferr != nil {
				return errForbidden // nothing is said of another's titles
			}
			b, _ := json.Marshal(key)
			p["session_id"] = b
		}
		if !c.can(scopes, key, false) {
			return errForbidden
		}
		return nil
	case needView, needWrite:
		return c.authorizeLive(scopes, p, n == needWrite, false)
	}
	return errForbidden
}

// authorizeLive checks a call on the session session_id names: a live
// session's runtime id (or, when byKey, a stored key too).
func (c *conn) authorizeLive(scopes []string, p params, write, byKey bool) error {
	sid, err := p.sessionID()
	if err != nil {
		return nil // the handler answers it
	}
	key := ""
	if byKey && store.ValidKey(sid) {
		key = sid
	} else if s, lerr := c.gw.table.Lookup(sid); lerr == nil {
		key = s.Key()
	} else if c.relayed(sid) == nil {
		return nil // unknown here: the handler answers 4001
	}
	if key == "" || !c.can(scopes, key, write) {
		return errForbidden
	}
	return nil
}

// keyOfTitle finds the stored key of the session titled title.
func (c *conn) keyOfTitle(title string) (string, error) {
	ctx, cancel := context.WithTimeout(c.gw.ctx, 10*time.Second)
	defer cancel()
	s, err := c.gw.store.FindByTitle(ctx, title)
	if err != nil {
		return "", fmt.Errorf("find %q: %w", title, err)
	}
	return s.Key, nil
}

// madeSession records that this connection created the session key:
// it reaches it at once, and its credential, when it is not admin, is
// granted the session for its other connections (Book.Grant, a store
// write, off the caller's path).
func (c *conn) madeSession(key string) {
	if key == "" || access.IsAdmin(c.scopes()) {
		return
	}
	c.mu.Lock()
	if c.created == nil {
		c.created = make(map[string]bool)
	}
	c.created[key] = true
	c.mu.Unlock()
	if c.gw.book == nil || c.who.Credential == "" {
		return
	}
	c.gw.grants.Go(func() {
		ctx, cancel := context.WithTimeout(c.gw.ctx, 10*time.Second)
		defer cancel()
		if err := c.gw.book.Grant(ctx, c.who.Credential, access.SessionScope(key, false)); err != nil && !errors.Is(err, context.Canceled) {
			c.log.Warn().Err(err).Str("session_key", key).Msg("the session this credential created is reachable on this connection only")
		}
	})
}

// filterKeys keeps of items those whose session key the connection
// reaches (all of them for admin).
func filterKeys[T any](c *conn, items []T, key func(T) string) []T {
	scopes := c.scopes()
	if access.IsAdmin(scopes) {
		return items
	}
	return slices.DeleteFunc(items, func(it T) bool { return !c.can(scopes, key(it), false) })
}
