package host

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/notify"
	"github.com/tether-agent/tether/host/store"
)

// TestPushReach is Web Push's scope rule from the credential book: a
// session:B credential does not reach A, a revoked one reaches nothing,
// a test event reaches admin only.
func TestPushReach(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	b := access.NewBook(st, zerolog.Nop())
	if err := b.SetAccessToken(ctx, "host-1", "admintoken"); err != nil {
		t.Fatal(err)
	}
	const a, bk = "20260102_030405_000001", "20260102_030405_000002"
	made := map[string]string{}
	for name, scopes := range map[string][]string{"a": {access.SessionScope(a, true)}, "b": {access.SessionScope(bk, false)}, "gone": {access.SessionScope(a, false)}, "t": {access.PTYScope("tok", false)}} {
		_, c, err := b.Create(ctx, name, access.KindMade, scopes, 0)
		if err != nil {
			t.Fatal(err)
		}
		made[name] = c.ID
	}
	admin, err := b.Verify("admintoken")
	if err != nil {
		t.Fatal(err)
	}
	made["admin"] = admin.Credential
	if _, err := b.Revoke(ctx, made["gone"]); err != nil {
		t.Fatal(err)
	}
	reach := pushReach(b)
	cases := []struct {
		cred, kind, id string
		want           bool
	}{
		{"a", notify.ReachSession, a, true},
		{"b", notify.ReachSession, a, false},
		{"b", notify.ReachSession, bk, true},
		{"gone", notify.ReachSession, a, false},
		{"t", notify.ReachPTY, "tok", true},
		{"t", notify.ReachPTY, "other", false},
		{"a", notify.ReachPTY, "tok", false},
		{"admin", notify.ReachSession, bk, true},
		{"admin", notify.ReachAdmin, "", true},
		{"a", notify.ReachAdmin, "", false},
	}
	for _, c := range cases {
		if got := reach(made[c.cred], c.kind, c.id); got != c.want {
			t.Errorf("%s reaches %s %q: got %v, want %v", c.cred, c.kind, c.id, got, c.want)
		}
	}
	if reach("nobody", notify.ReachSession, a) {
		t.Error("an unknown credential reaches a session")
	}
}
