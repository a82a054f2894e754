package ptyroute

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// adminWho is the access token's identity.
var adminWho = access.Identity{Name: access.AdminName, Scopes: []string{access.ScopeAdmin}}

// listedBackend is an attachRecorder whose List has the PTYs of live
// and whose attaches are reported on attached.
type listedBackend struct {
	attachRecorder
	live     []string
	attached chan struct{}
}

func (b *listedBackend) Attach(ctx context.Context, req contract.AttachRequest) (contract.AttachResponse, error) {
	resp, err := b.attachRecorder.Attach(ctx, req)
	b.attached <- struct{}{}
	return resp, err
}

func (b *listedBackend) List(context.Context) ([]contract.PTYInfo, error) {
	var out []contract.PTYInfo
	for _, t := range b.live {
		out = append(out, contract.PTYInfo{Token: t})
	}
	return out, nil
}

// notedSender reports each command on a channel.
type notedSender struct {
	cmds chan contract.Command
}

func (s *notedSender) Send(cmd contract.Command) { s.cmds <- cmd }

func (s *notedSender) WaitRoom(context.Context, time.Duration) bool { return true }

// TestPTYScopes: each kind of credential against a PTY socket's forms —
// the writer's and a viewer's attach of an existing PTY, a new token, no
// token. Refused ones are closed 4403 "forbidden: outside this
// credential's scope" and never reach the backend; a "new" credential's
// new PTY is granted to it. The same on a cluster's host serving the
// socket itself.
func TestPTYScopes(t *testing.T) {
	mine := strings.Repeat("m", 16)  // the PTY the credentials are about
	fresh := strings.Repeat("f", 16) // a token no PTY has yet
	queries := []string{"attach=" + mine, "attach=" + mine + "&view=1", "attach=" + fresh, ""}
	allowed := map[string][]bool{ // by query, in that order
		"admin":   {true, true, true, true},
		"new":     {false, false, true, true},
		"writer":  {true, true, false, false},
		"viewer":  {false, true, false, false},
		"other":   {false, false, false, false},
		"session": {false, false, false, false},
	}
	// On a single host, and on a cluster's host whose PTYs are located
	// on it (the socket is served there, not relayed).
	for _, clustered := range []bool{false, true} {
		book, who := scopeBook(t, mine, fresh)
		for name, want := range allowed {
			for i, q := range queries {
				tname := name + "/" + q
				if clustered {
					tname = "clustered/" + tname
				}
				t.Run(tname, func(t *testing.T) {
					testPTYScope(t, book, clustered, who[name], q, want[i], name == "new" && q == "attach="+fresh, mine, fresh)
				})
			}
		}
	}
}

// scopeBook makes a book with the access token and a credential of each
// kind TestPTYScopes tries, and returns it with their identities.
func scopeBook(t *testing.T, mine, fresh string) (*access.Book, map[string]access.Identity) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	book := access.NewBook(st, zerolog.Nop())
	if err := book.SetAccessToken(ctx, "host-1", "admintoken"); err != nil {
		t.Fatal(err)
	}
	who := map[string]access.Identity{}
	for name, scopes := range map[string][]string{
		"admin": nil, "new": {access.ScopeNew}, "writer": {access.PTYScope(mine, false)},
		"viewer": {access.PTYScope(mine, true)}, "other": {access.PTYScope(fresh+"x", false)}, "session": {access.SessionScope("k", false)},
	} {
		secret := "admintoken"
		if name != "admin" {
			if secret, _, err = book.Create(ctx, name, access.KindMade, scopes, 0); err != nil {
				t.Fatal(err)
			}
		}
		if who[name], err = book.Verify(secret); err != nil {
			t.Fatal(err)
		}
	}
	return book, who
}

// hereRemote is a cluster in which every PTY is this host's.
type hereRemote struct{}

func (hereRemote) Locate(context.Context, string) (string, string, error) { return "", "", nil }

func (hereRemote) Dial(context.Context, string, string, string, access.Identity, func(contract.Command)) (Leg, error) {
	panic("hereRemote: no PTY is on another host")
}

// testPTYScope is one row of TestPTYScopes: who opens the socket of
// query q on a host whose backend has the PTY mine (a cluster's host,
// the PTYs located on it, when clustered); want says it is admitted;
// granted, that fresh must then be granted to who.
func testPTYScope(t *testing.T, book *access.Book, clustered bool, who access.Identity, q string, want, granted bool, mine, fresh string) {
	r := New(zerolog.Nop(), metrics.New(), 200, 50)
	r.SetCredentials(book)
	if clustered {
		r.SetRemote(hereRemote{})
	}
	be := &listedBackend{live: []string{mine}, attached: make(chan struct{}, 1)}
	r.SetBackend(be)
	out := &notedSender{cmds: make(chan contract.Command, 16)}
	c := r.Open(link.Opening{
		ID: contract.TransportID{Instance: "ws", Conn: 1}, Transport: "ws",
		Event: &contract.Event{Kind: contract.EventOpened, Path: "/api/pty", Query: q},
		Out:   out, Who: who,
	})
	first := <-out.cmds
	if !want {
		if c != nil && first.Kind == contract.CommandAdmit {
			// Admitted, then refused at the attach (a PTY that exists).
			first = <-out.cmds
			c.OnClosed()
		}
		if first.Kind != contract.CommandClose || first.Code != wire.CloseForbidden || first.Reason != "forbidden: outside this credential's scope" {
			t.Fatalf("got %+v, want close 4403 forbidden", first)
		}
		r.Wait()
		if len(be.reqs) != 0 {
			t.Fatalf("a refused socket reached the backend: %+v", be.reqs)
		}
		return
	}
	if c == nil || first.Kind != contract.CommandAdmit {
		t.Fatalf("got %+v, want admitted", first)
	}
	select {
	case <-be.attached:
	case <-time.After(10 * time.Second):
		t.Fatal("the attach never reached the backend")
	}
	c.OnClosed()
	r.Wait()
	if granted {
		if s := book.Scopes(who.Credential); !strings.Contains(strings.Join(s, " "), access.PTYScope(fresh, false)) {
			t.Fatalf("the new PTY was not granted: scopes %v", s)
		}
	}
}
