package access

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/store"
)

// Scopes a credential may hold.
const (
	// ScopeAdmin may do everything: the access token's scope.
	ScopeAdmin = "admin"
)

// Kinds of credentials (store.Credential.Kind).
const (
	// KindToken is a host's access token (--token, the token file).
	KindToken = "token"
	// KindPage is a browser's sign-in: the page cookie's value, made
	// from the credential the browser signed in with.
	KindPage = "page"
	// KindMade is a credential an operator made (tether token create).
	KindMade = "credential"
	// KindShare is a share link's credential (tether share).
	KindShare = "share"
)

// AdminName is the name of the access token's credential: who did
// what says "admin" for it.
const AdminName = "admin"

// PageTTL is how long a page sign-in lasts: 400 days, the longest a
// browser keeps a cookie.
const PageTTL = 400 * 24 * time.Hour

// maxPagesPerParent bounds the page sign-ins kept for one credential:
// each page load with ?token= makes one, and past this the oldest goes
// (its browser is signed out and signs in again with the URL).
const maxPagesPerParent = 64

// Verification errors.
var (
	// ErrUnknownCredential: no such credential (never made, revoked, or
	// made from a credential that is gone or whose secret changed).
	ErrUnknownCredential = errors.New("unknown credential")
	// ErrCredentialExpired: the credential's time is up.
	ErrCredentialExpired = errors.New("credential expired")
)

// Identity is who a connection's credential names, as the host that
// checked it verified it. A relayed connection carries its edge host's.
type Identity struct {
	// Name is the credential's name ("admin" for the access token).
	Name string `json:"name"`
	// Scopes are what it may do.
	Scopes []string `json:"scopes"`
	// Credential is the ID of the credential presented.
	Credential string `json:"credential,omitempty"`
}

// IsZero reports whether id names nobody.
func (id Identity) IsZero() bool { return id.Name == "" && len(id.Scopes) == 0 }

// Admin reports whether id may do everything.
func (id Identity) Admin() bool { return slices.Contains(id.Scopes, ScopeAdmin) }

// Hash returns the lower-case hex SHA-256 of secret, the key a
// credential is stored under.
func Hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Book holds the credentials a host accepts: its access token, the page
// sign-ins made from it, and (in a cluster) every other host's, indexed
// in memory by their secrets' hashes. Writes go to the store first, then
// to the index; Apply takes changes other hosts made (a cluster's
// watch). Its methods are safe for concurrent use.
type Book struct {
	store store.CredentialStore
	log   zerolog.Logger
	now   func() time.Time

	grants sync.Mutex // serialises Grant's read-modify-write of a credential

	mu      sync.Mutex // guards the fields below
	byHash  map[string]store.Credential
	byID    map[string]string    // ID → Hash
	used    map[string]time.Time // ID → when Verify last accepted it, not yet stored
	changed chan struct{}        // closed (and replaced) when a credential changes
}

// NewBook returns a book of the credentials in st (see Load).
func NewBook(st store.CredentialStore, log zerolog.Logger) *Book {
	return &Book{store: st, log: log, now: time.Now,
		byHash: make(map[string]store.Credential), byID: make(map[string]string),
		used: make(map[string]time.Time), changed: make(chan struct{})}
}

// Load reads every stored credential into the book.
func (b *Book) Load(ctx context.Context) error {
	cs, err := b.store.Credentials(ctx)
	if err != nil {
		return fmt.Errorf("credentials: %w", err)
	}
	for _, c := range cs {
		b.Apply(c, false)
	}
	return nil
}

// Prune removes the page sign-ins that expired, or whose credential is
// gone or changed, from the book and the store.
func (b *Book) Prune(ctx context.Context) error {
	now := b.now()
	b.mu.Lock()
	var gone []store.Credential
	for _, c := range b.byHash {
		if c.Kind != KindPage {
			continue
		}
		expired := !c.Expires.IsZero() && !now.Before(c.Expires)
		if parent, ok := b.byID[c.Parent]; expired || !ok || parent != c.ParentHash {
			gone = append(gone, c)
		}
	}
	b.mu.Unlock()
	for _, c := range gone {
		if err := b.store.DeleteCredential(ctx, c.Hash); err != nil {
			return fmt.Errorf("credentials: %w", err)
		}
		b.Apply(c, true)
	}
	return nil
}

// Apply records a change of a stored credential made elsewhere (another
// host of the cluster): c was put, or deleted.
func (b *Book) Apply(c store.Credential, deleted bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.changed)
	b.changed = make(chan struct{})
	if deleted {
		b.removeLocked(c.Hash)
		return
	}
	if old, ok := b.byID[c.ID]; ok && old != c.Hash {
		b.removeLocked(old)
	}
	b.byHash[c.Hash] = c
	b.byID[c.ID] = c.Hash
}

func (b *Book) removeLocked(hash string) {
	if c, ok := b.byHash[hash]; ok {
		delete(b.byHash, hash)
		if b.byID[c.ID] == hash {
			delete(b.byID, c.ID)
		}
	}
}

// SetAccessToken makes token the credential id (name "admin", scope
// admin): the host's access token. A credential of that id with another
// secret (the token was changed) is replaced, and the page sign-ins made
// from it stop being valid. The book accepts it even when the store
// cannot keep it (the error says so): this host then accepts it, other
// hosts of a cluster do not.
func (b *Book) SetAccessToken(ctx context.Context, id, token string) error {
	if token == "" {
		return errors.New("credentials: empty access token")
	}
	hash := Hash(token)
	b.mu.Lock()
	cur, ok := b.byHash[hash]
	b.mu.Unlock()
	if ok && cur.ID == id && cur.Kind == KindToken {
		return nil
	}
	c := store.Credential{Hash: hash, ID: id, Name: AdminName, Kind: KindToken, Scopes: []string{ScopeAdmin}, Created: b.now().UTC()}
	b.Apply(c, false)
	if err := b.store.PutCredential(ctx, c); err != nil {
		return fmt.Errorf("credentials: the access token: %w", err)
	}
	return nil
}

// Verify returns the identity secret names: ErrUnknownCredential when
// the book has no such credential (or it was made from one that is gone
// or changed), ErrCredentialExpired when its time is up. Only the
// secret's hash is looked up, so its timing tells nothing of a secret.
func (b *Book) Verify(secret string) (Identity, error) {
	if secret == "" {
		return Identity{}, ErrUnknownCredential
	}
	hash := Hash(secret)
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.byHash[hash]
	if !ok {
		return Identity{}, ErrUnknownCredential
	}
	root, err := b.rootLocked(c, now)
	if err != nil {
		return Identity{}, err
	}
	b.used[root.ID] = now
	return Identity{Name: c.Name, Scopes: slices.Clone(root.Scopes), Credential: c.ID}, nil
}

// rootLocked returns the credential c was made from at the top of its
// chain (c itself when it was made from none), checking that each link
// is valid at now: ErrCredentialExpired, or ErrUnknownCredential for a
// parent that is gone or whose secret changed. The root's scopes are
// the chain's: what a credential is granted reaches its page sign-ins.
func (b *Book) rootLocked(c store.Credential, now time.Time) (store.Credential, error) {
	p := c
	for depth := 0; ; depth++ {
		if !p.Expires.IsZero() && !now.Before(p.Expires) {
			return store.Credential{}, ErrCredentialExpired
		}
		if p.Parent == "" {
			return p, nil
		}
		parentHash, ok := b.byID[p.Parent]
		if !ok || parentHash != p.ParentHash || depth > 4 {
			return store.Credential{}, ErrUnknownCredential
		}
		p = b.byHash[parentHash]
	}
}

// SignIn makes a page sign-in for the credential from names (the one a
// browser presented with ?token=) and returns its secret, the page
// cookie's value. It lasts PageTTL, or as long as from's credential when
// that is shorter, and stops being valid with that credential.
func (b *Book) SignIn(ctx context.Context, from Identity) (string, error) {
	b.mu.Lock()
	parentHash, ok := b.byID[from.Credential]
	parent := b.byHash[parentHash]
	var old []store.Credential
	for _, c := range b.byHash {
		if c.Kind == KindPage && c.Parent == from.Credential {
			old = append(old, c)
		}
	}
	b.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("sign in: %w", ErrUnknownCredential)
	}
	now := b.now().UTC()
	secret := contract.RandomHex(16)
	c := store.Credential{
		Hash: Hash(secret), ID: "page-" + contract.RandomHex(6), Name: parent.Name, Kind: KindPage,
		Scopes: slices.Clone(parent.Scopes), Parent: parent.ID, ParentHash: parent.Hash,
		Created: now, Expires: now.Add(PageTTL),
	}
	if !parent.Expires.IsZero() && parent.Expires.Before(c.Expires) {
		c.Expires = parent.Expires
	}
	if err := b.store.PutCredential(ctx, c); err != nil {
		return "", fmt.Errorf("sign in: %w", err)
	}
	b.Apply(c, false)
	// Keep at most maxPagesPerParent sign-ins per credential: the oldest
	// go first.
	if len(old)+1 > maxPagesPerParent {
		sort.Slice(old, func(i, j int) bool { return old[i].Created.Before(old[j].Created) })
		for _, o := range old[:len(old)+1-maxPagesPerParent] {
			if err := b.store.DeleteCredential(ctx, o.Hash); err != nil {
				b.log.Warn().Err(err).Str("credential", o.ID).Msg("removing an old page sign-in")
				continue
			}
			b.Apply(o, true)
		}
	}
	return secret, nil
}

// Credentials lists the book's credentials (never their secrets, which
// it does not have), ordered by creation.
func (b *Book) Credentials() []store.Credential {
	b.mu.Lock()
	out := make([]store.Credential, 0, len(b.byHash))
	for _, c := range b.byHash {
		out = append(out, c)
	}
	b.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Parent returns the ID of the credential the credential id was made
// from, "" when it was made from none (or is not in the book).
func (b *Book) Parent(id string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.byHash[b.byID[id]].Parent
}
