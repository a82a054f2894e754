package access

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Scopes besides ScopeAdmin (docs/PROTOCOL.md, "Credentials and
// scopes"):
//
//	admin               everything
//	new                 create sessions and PTYs, then reach only those
//	session:KEY         that stored session: resume, events, prompts,
//	                    cancel, permission answers, close
//	session:KEY:view    resume it as a viewer and read its events only
//	pty:TOKEN           that PTY as its writer (or a viewer)
//	pty:TOKEN:view      that PTY as a viewer only
//
// A credential made with no scope is "new". What a "new" credential
// creates is granted to it as session:KEY or pty:TOKEN (Book.Grant).
const (
	// ScopeNew may create sessions and PTYs and then reach only those.
	ScopeNew = "new"
	// ScopeSession prefixes a session scope: session:KEY[:view].
	ScopeSession = "session"
	// ScopePTY prefixes a PTY scope: pty:TOKEN[:view].
	ScopePTY = "pty"
	// viewSuffix marks a read-only scope.
	viewSuffix = ":view"
)

// ErrForbidden is a call outside the credential's scope: JSON-RPC 4030,
// close 4403 on a PTY or ACP socket. Its text is the protocol's.
var ErrForbidden = errors.New("forbidden: outside this credential's scope")

// ErrBadScope is a scope that is not one of the forms above.
var ErrBadScope = errors.New("bad scope")

// maxScopeID bounds the KEY or TOKEN of a scope.
const maxScopeID = 128

// ParseScope checks that s is one of the scope forms and returns it as
// stored.
func ParseScope(s string) (string, error) {
	switch s {
	case ScopeAdmin, ScopeNew:
		return s, nil
	}
	kind, rest, ok := strings.Cut(s, ":")
	if !ok || (kind != ScopeSession && kind != ScopePTY) {
		return "", fmt.Errorf("%w %q: want admin, new, session:KEY[:view] or pty:TOKEN[:view]", ErrBadScope, s)
	}
	id := strings.TrimSuffix(rest, viewSuffix)
	if id == "" || len(id) > maxScopeID || strings.ContainsAny(id, ": \t\r\n/?#&=") {
		return "", fmt.Errorf("%w %q: the %s after %q is empty, too long or has a separator", ErrBadScope, s, map[string]string{ScopeSession: "session key", ScopePTY: "attach token"}[kind], kind+":")
	}
	return s, nil
}

// SessionScope returns the scope over the stored session key: view for
// a read-only one.
func SessionScope(key string, view bool) string { return scopeOf(ScopeSession, key, view) }

// PTYScope returns the scope over the PTY of attach token token: view
// for a read-only one.
func PTYScope(token string, view bool) string { return scopeOf(ScopePTY, token, view) }

func scopeOf(kind, id string, view bool) string {
	if view {
		return kind + ":" + id + viewSuffix
	}
	return kind + ":" + id
}

// Can reports whether scopes reach the kind (ScopeSession or ScopePTY)
// thing id: as its writer when write, else as a viewer. admin reaches
// everything; a writer's scope includes its view.
func Can(scopes []string, kind, id string, write bool) bool {
	if slices.Contains(scopes, ScopeAdmin) {
		return true
	}
	if id == "" {
		return false
	}
	if slices.Contains(scopes, scopeOf(kind, id, false)) {
		return true
	}
	return !write && slices.Contains(scopes, scopeOf(kind, id, true))
}

// CanCreate reports whether scopes may create sessions and PTYs.
func CanCreate(scopes []string) bool {
	return slices.Contains(scopes, ScopeAdmin) || slices.Contains(scopes, ScopeNew)
}

// IsAdmin reports whether scopes include admin.
func IsAdmin(scopes []string) bool { return slices.Contains(scopes, ScopeAdmin) }

// OnlyView reports whether scopes reach the kind thing id as a viewer
// and not as its writer.
func OnlyView(scopes []string, kind, id string) bool {
	return Can(scopes, kind, id, false) && !Can(scopes, kind, id, true)
}

// ScopesOf returns what who may do now: for a stored credential the
// book's current scopes (a grant or a revocation counts at once; none
// once it is revoked), else those its identity carries (a reverse
// proxy's user, or a test's).
func ScopesOf(b *Book, who Identity) []string {
	if who.Credential != "" && b != nil {
		return b.Scopes(who.Credential)
	}
	return who.Scopes
}
