package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Credential is a stored credential: who may present it (its name and
// scopes) and its secret's SHA-256 — never the secret itself.
type Credential struct {
	// Hash is the lower-case hex SHA-256 of the secret; it is the key.
	Hash string `json:"hash"`
	// ID names the credential in listings and revocations; unique.
	ID string `json:"id"`
	// Name is who holds it ("admin" for the access token).
	Name string `json:"name"`
	// Kind is what made it: "token" (a host's access token), "page" (a
	// browser's sign-in), "credential" (made by an operator).
	Kind string `json:"kind"`
	// Scopes are what it may do ("admin", …).
	Scopes []string `json:"scopes"`
	// Parent is the ID of the credential this one was made from (a
	// page sign-in's), and ParentHash that one's Hash at the time: it is
	// valid only while the parent is, with the same secret.
	Parent     string `json:"parent,omitempty"`
	ParentHash string `json:"parent_hash,omitempty"`
	// Created is when it was made; Expires when it stops being valid
	// (zero: never); LastUsed when it was last presented (zero: never,
	// or not recorded).
	Created  time.Time `json:"created"`
	Expires  time.Time `json:"expires,omitzero"`
	LastUsed time.Time `json:"last_used,omitzero"`
}

// CredentialStore keeps credentials. *Store keeps them in state.db; a
// cluster keeps them where every host reads them.
type CredentialStore interface {
	// Credentials lists every stored credential.
	Credentials(ctx context.Context) ([]Credential, error)
	// PutCredential stores c, replacing the one with its Hash or its ID.
	PutCredential(ctx context.Context, c Credential) error
	// DeleteCredential removes the credential whose Hash is hash; one
	// that is not there is no error.
	DeleteCredential(ctx context.Context, hash string) error
}

var _ CredentialStore = (*Store)(nil)

// Credentials implements CredentialStore.
func (s *Store) Credentials(ctx context.Context) ([]Credential, error) {
	rows, err := s.reader().QueryContext(ctx,
		`SELECT hash, id, name, kind, scopes, parent, parent_hash, created_at, expires_at, last_used FROM credentials ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	defer rows.Close()
	var out []Credential
	for rows.Next() {
		var c Credential
		var scopes string
		var created, expires, used int64
		if err := rows.Scan(&c.Hash, &c.ID, &c.Name, &c.Kind, &scopes, &c.Parent, &c.ParentHash, &created, &expires, &used); err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		if err := json.Unmarshal([]byte(scopes), &c.Scopes); err != nil {
			return nil, fmt.Errorf("credentials: %s: scopes: %w", c.ID, err)
		}
		c.Created, c.Expires, c.LastUsed = timeOf(created), timeOf(expires), timeOf(used)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	return out, nil
}

// PutCredential implements CredentialStore.
func (s *Store) PutCredential(ctx context.Context, c Credential) error {
	if c.Hash == "" || c.ID == "" || c.Name == "" || c.Kind == "" {
		return fmt.Errorf("put credential: hash, id, name and kind are needed: %w", ErrInvalid)
	}
	scopes, err := json.Marshal(c.Scopes)
	if err != nil {
		return fmt.Errorf("put credential %s: %w", c.ID, err)
	}
	if c.Scopes == nil {
		scopes = []byte("[]")
	}
	return s.write(func() error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("put credential %s: %w", c.ID, err)
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, `DELETE FROM credentials WHERE id = ? OR hash = ?`, c.ID, c.Hash); err != nil {
			return fmt.Errorf("put credential %s: %w", c.ID, err)
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO credentials (hash, id, name, kind, scopes, parent, parent_hash, created_at, expires_at, last_used)
			 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			c.Hash, c.ID, c.Name, c.Kind, string(scopes), c.Parent, c.ParentHash,
			unixOf(c.Created), unixOf(c.Expires), unixOf(c.LastUsed)); err != nil {
			return fmt.Errorf("put credential %s: %w", c.ID, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("put credential %s: %w", c.ID, err)
		}
		return nil
	})
}

// DeleteCredential implements CredentialStore.
func (s *Store) DeleteCredential(ctx context.Context, hash string) error {
	return s.write(func() error {
		if _, err := s.db.ExecContext(ctx, `DELETE FROM credentials WHERE hash = ?`, hash); err != nil {
			return fmt.Errorf("delete credential: %w", err)
		}
		return nil
	})
}
