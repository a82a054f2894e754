package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// maxTTL bounds a credential's lifetime as asked: ten years.
const maxTTL = 10 * 365 * 24 * time.Hour

// SetCredentials gives the gateway the host's credential book: calls
// are then checked against the book's current scopes of their
// credential, and credential.* serve. Call it before the first
// connection.
func (g *Gateway) SetCredentials(b *access.Book) { g.book = b }

// SetPageURL sets the host's public URL (scheme://host:port), the base
// of the URLs credential.create answers with.
func (g *Gateway) SetPageURL(u string) { g.pageURL.Store(&u) }

func (g *Gateway) pageBase() string {
	if p := g.pageURL.Load(); p != nil {
		return strings.TrimRight(*p, "/")
	}
	return ""
}

func infoOf(c store.Credential) wire.CredentialInfo {
	i := wire.CredentialInfo{ID: c.ID, Name: c.Name, Kind: c.Kind, Scopes: c.Scopes, Created: c.Created.Unix()}
	if i.Scopes == nil {
		i.Scopes = []string{}
	}
	if !c.Expires.IsZero() {
		i.Expires = c.Expires.Unix()
	}
	if !c.LastUsed.IsZero() {
		i.LastUsed = c.LastUsed.Unix()
	}
	return i
}

// decodeInto decodes the call's params into v (strictly: unknown
// fields are refused), -32602 when they do not fit.
func decodeInto(p params, v any) error {
	b, err := json.Marshal(p)
	if err != nil {
		return errorf(wire.CodeInvalidParams, "params: %v", err)
	}
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return errorf(wire.CodeInvalidParams, "params: %v", err)
	}
	return nil
}

func (c *conn) credentialCreate(cl call, p params) (any, error) {
	if c.gw.book == nil {
		return nil, errorf(wire.CodeInternalError, "this host keeps no credentials")
	}
	var req wire.CredentialCreateParams
	if err := decodeInto(p, &req); err != nil {
		return nil, err
	}
	if req.TTLSeconds < 0 || time.Duration(req.TTLSeconds)*time.Second > maxTTL {
		return nil, errorf(wire.CodeInvalidParams, "ttl_seconds must be between 0 (until revoked) and %d (ten years)", int64(maxTTL/time.Second))
	}
	kind := access.KindMade
	var target url.Values
	if req.Share {
		kind = access.KindShare
		var err error
		if target, err = c.shareTarget(req.Scopes); err != nil {
			return nil, err
		}
		if req.Name == "" {
			req.Name = "share-" + contract.RandomHex(3)
		}
	}
	for _, s := range req.Scopes {
		if _, err := access.ParseScope(s); err != nil {
			return nil, errorf(wire.CodeInvalidParams, "%v", err)
		}
	}
	if err := access.CheckName(req.Name); err != nil {
		return nil, errorf(wire.CodeInvalidParams, "%v", err)
	}
	ctx, cancel := context.WithTimeout(c.gw.ctx, 10*time.Second)
	defer cancel()
	secret, cred, err := c.gw.book.Create(ctx, req.Name, kind, req.Scopes, time.Duration(req.TTLSeconds)*time.Second)
	if err != nil {
		return nil, errorf(wire.CodeStorageUnavailable, "storage unavailable: %v", err)
	}
	c.log.Info().Str("credential", cred.ID).Str("name", cred.Name).Strs("scopes", cred.Scopes).Str("by", c.who.Name).Msg("credential made")
	out := wire.CredentialCreated{Credential: infoOf(cred), Secret: secret}
	if base := c.gw.pageBase(); base != "" {
		q := url.Values{"token": {secret}}
		for k, v := range target {
			q[k] = v
		}
		out.URL = base + "/?" + q.Encode()
	}
	return out, nil
}

// shareTarget checks a share's scopes — exactly one session or PTY
// scope — and returns what the page's URL opens: attach=TOKEN or
// session=KEY, and view=1 for a read-only one. A session share needs
// the stored session (4007).
func (c *conn) shareTarget(scopes []string) (url.Values, error) {
	if len(scopes) != 1 {
		return nil, errorf(wire.CodeInvalidParams, "a share has exactly one scope: session:KEY[:view] or pty:TOKEN[:view]")
	}
	s, err := access.ParseScope(scopes[0])
	if err != nil {
		return nil, errorf(wire.CodeInvalidParams, "%v", err)
	}
	kind, rest, _ := strings.Cut(s, ":")
	id, view := strings.CutSuffix(rest, ":view")
	q := url.Values{}
	switch kind {
	case access.ScopePTY:
		q.Set("attach", id)
	case access.ScopeSession:
		ctx, cancel := context.WithTimeout(c.gw.ctx, 10*time.Second)
		defer cancel()
		if _, err := c.gw.store.GetSession(ctx, id); errors.Is(err, store.ErrNotFound) {
			return nil, errorf(wire.CodeStoredNotFound, "stored session not found: %s", id)
		} else if err != nil {
			return nil, errorf(wire.CodeStorageUnavailable, "storage unavailable: %v", err)
		}
		q.Set("session", id)
	default:
		return nil, errorf(wire.CodeInvalidParams, "a share is of one session or one PTY, not %q", s)
	}
	if view {
		q.Set("view", "1")
	}
	return q, nil
}

func (c *conn) credentialList(cl call, p params) (any, error) {
	if c.gw.book == nil {
		return wire.CredentialList{Credentials: []wire.CredentialInfo{}}, nil
	}
	out := wire.CredentialList{Credentials: []wire.CredentialInfo{}}
	for _, cr := range c.gw.book.Credentials() {
		if cr.Kind == access.KindPage {
			continue // a browser's sign-in: revoked with what it was made from
		}
		out.Credentials = append(out.Credentials, infoOf(cr))
	}
	return out, nil
}

func (c *conn) credentialRevoke(cl call, p params) (any, error) {
	var req wire.CredentialRevokeParams
	if err := decodeInto(p, &req); err != nil {
		return nil, err
	}
	if req.Credential == "" {
		return nil, errorf(wire.CodeInvalidParams, "credential must name an ID or a name")
	}
	if c.gw.book == nil {
		return nil, errorf(wire.CodeInvalidParams, "no such credential: %q", req.Credential)
	}
	ctx, cancel := context.WithTimeout(c.gw.ctx, 10*time.Second)
	defer cancel()
	gone, err := c.gw.book.Revoke(ctx, req.Credential)
	switch {
	case errors.Is(err, access.ErrNoSuchCredential):
		return nil, errorf(wire.CodeInvalidParams, "no such credential: %q", req.Credential)
	case errors.Is(err, access.ErrAccessToken):
		return nil, errorf(wire.CodeInvalidParams, "%v", err)
	case err != nil:
		return nil, errorf(wire.CodeStorageUnavailable, "storage unavailable: %v", err)
	}
	out := wire.CredentialRevoked{Revoked: []wire.CredentialInfo{}}
	for _, cr := range gone {
		out.Revoked = append(out.Revoked, infoOf(cr))
		c.log.Info().Str("credential", cr.ID).Str("name", cr.Name).Str("by", c.who.Name).Msg("credential revoked")
	}
	return out, nil
}
