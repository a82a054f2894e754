package access

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/store"
)

// Why a connection's credential stopped being valid: the reason of the
// 4401 that closes its sockets (docs/PROTOCOL.md, "Credentials and
// scopes").
const (
	ReasonRevoked = "credential revoked"
	ReasonExpired = "credential expired"
)

// maxGrants bounds what a "new" credential is granted (the sessions and
// PTYs it created); past it, creating more is refused.
const maxGrants = 1024

// maxNameBytes bounds a credential's name.
const maxNameBytes = 64

// ErrNoSuchCredential is a revocation of an ID or name the book has not.
var ErrNoSuchCredential = errors.New("no such credential")

// ErrAccessToken is a revocation of a host's access token: it is
// changed, not revoked.
var ErrAccessToken = errors.New("a host's access token: change the token (--token or the token file) instead")

// ErrTooManyGrants is a "new" credential that created maxGrants sessions
// and PTYs already.
var ErrTooManyGrants = errors.New("this credential created too many sessions and PTYs; make another")

// CheckName checks a credential's name: 1 to 64 printable bytes, not the
// access token's "admin".
func CheckName(name string) error {
	switch {
	case name == "":
		return errors.New("a credential needs a name")
	case len(name) > maxNameBytes:
		return fmt.Errorf("name %.16q…: longer than %d bytes", name, maxNameBytes)
	case name == AdminName:
		return fmt.Errorf("name %q is the access token's", name)
	case strings.IndexFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return fmt.Errorf("name %q has a control character", name)
	}
	return nil
}

// Create makes a credential named name with scopes (ScopeNew when none)
// of kind (KindMade or KindShare), valid for ttl (0: until revoked), and
// returns its secret — shown once, stored only as its hash.
func (b *Book) Create(ctx context.Context, name, kind string, scopes []string, ttl time.Duration) (string, store.Credential, error) {
	if err := CheckName(name); err != nil {
		return "", store.Credential{}, err
	}
	if len(scopes) == 0 {
		scopes = []string{ScopeNew}
	}
	clean := make([]string, 0, len(scopes))
	for _, s := range scopes {
		s, err := ParseScope(s)
		if err != nil {
			return "", store.Credential{}, err
		}
		if !slices.Contains(clean, s) {
			clean = append(clean, s)
		}
	}
	if ttl < 0 {
		return "", store.Credential{}, fmt.Errorf("ttl %v: negative", ttl)
	}
	now := b.now().UTC()
	secret := contract.RandomHex(24)
	c := store.Credential{Hash: Hash(secret), ID: "cred-" + contract.RandomHex(6), Name: name, Kind: kind, Scopes: clean, Created: now}
	if ttl > 0 {
		c.Expires = now.Add(ttl)
	}
	if err := b.store.PutCredential(ctx, c); err != nil {
		return "", store.Credential{}, fmt.Errorf("credentials: %w", err)
	}
	b.Apply(c, false)
	return secret, c, nil
}

// Revoke removes the credentials whose ID or name is idOrName (a name
// may name several) and the page sign-ins made from them, and returns
// the removed ones (not the sign-ins). The access token ("admin") is not
// revoked this way: change it instead.
func (b *Book) Revoke(ctx context.Context, idOrName string) ([]store.Credential, error) {
	b.mu.Lock()
	var hit, pages []store.Credential
	for _, c := range b.byHash {
		if c.Kind != KindPage && (c.ID == idOrName || c.Name == idOrName) {
			hit = append(hit, c)
		}
	}
	for _, c := range b.byHash {
		for _, h := range hit {
			if c.Kind == KindPage && c.Parent == h.ID {
				pages = append(pages, c)
			}
		}
	}
	b.mu.Unlock()
	if len(hit) == 0 {
		return nil, fmt.Errorf("%q: %w", idOrName, ErrNoSuchCredential)
	}
	for _, c := range hit {
		if c.Kind == KindToken {
			return nil, fmt.Errorf("%q is %w", idOrName, ErrAccessToken)
		}
	}
	for _, c := range append(hit, pages...) {
		if err := b.store.DeleteCredential(ctx, c.Hash); err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		b.Apply(c, true)
	}
	return hit, nil
}

// Check reports whether the credential id is still valid: nil,
// ErrUnknownCredential once it (or what it was made from) is revoked,
// ErrCredentialExpired once its time is up.
func (b *Book) Check(id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.byID[id]
	if !ok {
		return ErrUnknownCredential
	}
	_, err := b.rootLocked(b.byHash[h], b.now())
	return err
}

// Scopes returns the scopes that apply to the credential id now (its
// chain's root's, see Verify), nil when it is not valid.
func (b *Book) Scopes(id string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.byID[id]
	if !ok {
		return nil
	}
	root, err := b.rootLocked(b.byHash[h], b.now())
	if err != nil {
		return nil
	}
	return slices.Clone(root.Scopes)
}

// Grant adds scope to the credential id's chain root (so its page
// sign-ins have it too): what a "new" credential created becomes its
// own. An admin credential needs no grant.
func (b *Book) Grant(ctx context.Context, id, scope string) error {
	b.grants.Lock()
	defer b.grants.Unlock()
	b.mu.Lock()
	h, ok := b.byID[id]
	var root store.Credential
	var err error
	if ok {
		root, err = b.rootLocked(b.byHash[h], b.now())
	}
	b.mu.Unlock()
	switch {
	case !ok:
		return ErrUnknownCredential
	case err != nil:
		return err
	case slices.Contains(root.Scopes, ScopeAdmin) || slices.Contains(root.Scopes, scope):
		return nil
	case len(root.Scopes) >= maxGrants:
		return ErrTooManyGrants
	}
	root.Scopes = append(slices.Clone(root.Scopes), scope)
	if err := b.store.PutCredential(ctx, root); err != nil {
		return fmt.Errorf("credentials: granting %s: %w", scope, err)
	}
	b.Apply(root, false)
	return nil
}

// Changed returns a channel closed at the book's next change (a
// credential made, granted, revoked, here or on another host).
func (b *Book) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

// NextExpiry returns the earliest expiry after now among the book's
// credentials, zero when none expires.
func (b *Book) NextExpiry() time.Time {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	var next time.Time
	for _, c := range b.byHash {
		if !c.Expires.IsZero() && c.Expires.After(now) && (next.IsZero() || c.Expires.Before(next)) {
			next = c.Expires
		}
	}
	return next
}

// FlushUsed stores when each credential accepted since the last flush
// was last presented (tether token list's "last used"). A page sign-in
// counts for the credential it was made from.
func (b *Book) FlushUsed(ctx context.Context) error {
	b.grants.Lock() // a Grant's read-modify-write must not interleave
	defer b.grants.Unlock()
	b.mu.Lock()
	var dirty []store.Credential
	for id, t := range b.used {
		if h, ok := b.byID[id]; ok {
			c := b.byHash[h]
			if t.After(c.LastUsed.Add(time.Second)) {
				c.LastUsed = t.UTC().Truncate(time.Second)
				dirty = append(dirty, c)
			}
		}
		delete(b.used, id)
	}
	b.mu.Unlock()
	for _, c := range dirty {
		if err := b.store.PutCredential(ctx, c); err != nil {
			return fmt.Errorf("credentials: last used: %w", err)
		}
		b.Apply(c, false)
	}
	return nil
}
