package rpc

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/wire"
)

// The credentials of the scope table's columns: the access token, a
// "new" one, the writer's and the viewer's of session A, the writer's
// of session B, and a PTY's.
var scopeColumns = []string{"admin", "new", "session:A", "session:A:view", "session:B", "pty:T"}

// scopeRow is one method of the scope table: its params (A and B stand
// for the sessions' runtime ids or keys) and the columns that may call
// it. A listing (filtered to the credential's scope) says how many
// sessions each column sees.
type scopeRow struct {
	params  string
	allowed []string
	listed  map[string]int
}

// scopeTable is every gateway method against every kind of scope
// (docs/PROTOCOL.md, "Credentials and scopes"). A method added to the
// gateway without a row here fails TestScopeTableCoversEveryMethod.
var scopeTable = map[string]scopeRow{
	wire.MethodCreate:            {`{}`, []string{"admin", "new"}, nil},
	wire.MethodBranch:            {`{"session_id":"$rA"}`, []string{"admin"}, nil},
	wire.MethodResume:            {`{"session_id":"$kA"}`, []string{"admin", "session:A", "session:A:view"}, nil},
	wire.MethodActivate:          {`{"session_id":"$rA"}`, []string{"admin", "session:A", "session:A:view"}, nil},
	wire.MethodClose:             {`{"session_id":"$rA"}`, []string{"admin", "session:A"}, nil},
	wire.MethodEventsSince:       {`{"session_id":"$rA","last_seen":0}`, []string{"admin", "session:A", "session:A:view"}, nil},
	wire.MethodSubmit:            {`{"session_id":"$rA","text":"again"}`, []string{"admin", "session:A"}, nil},
	wire.MethodRuns:              {`{"session_id":"$rA"}`, []string{"admin", "session:A", "session:A:view"}, nil},
	wire.MethodInterrupt:         {`{"session_id":"$rA"}`, []string{"admin", "session:A"}, nil},
	wire.MethodPermissionRespond: {`{"session_id":"$rA","request_id":"r1","option_id":"allow"}`, []string{"admin", "session:A"}, nil},
	wire.MethodClusterHosts:      {`{}`, []string{"admin"}, nil},
	wire.MethodCredentialCreate:  {`{"name":"laptop"}`, []string{"admin"}, nil},
	wire.MethodCredentialList:    {`{}`, []string{"admin"}, nil},
	wire.MethodCredentialRevoke:  {`{"credential":"phone"}`, []string{"admin"}, nil},
	wire.MethodPushKey:           {`{}`, scopeColumns, nil},
	wire.MethodPushSubscribe:     {`{"endpoint":"https://push.example/x","keys":{"p256dh":"p","auth":"a"}}`, scopeColumns, nil},
	wire.MethodPushUnsubscribe:   {`{"endpoint":"https://push.example/x"}`, scopeColumns, nil},
	wire.MethodActiveList: {`{}`, scopeColumns,
		map[string]int{"admin": 2, "new": 0, "session:A": 1, "session:A:view": 1, "session:B": 1, "pty:T": 0}},
	wire.MethodList: {`{}`, scopeColumns,
		map[string]int{"admin": 2, "new": 0, "session:A": 1, "session:A:view": 1, "session:B": 1, "pty:T": 0}},
}

func TestScopeTableCoversEveryMethod(t *testing.T) {
	for name := range methods {
		if _, ok := scopeTable[name]; !ok {
			t.Errorf("method %s has no row in the scope table", name)
		}
	}
	for name := range scopeTable {
		if _, ok := methods[name]; !ok {
			t.Errorf("the scope table has a row for %s, which the gateway does not serve", name)
		}
	}
}

// scopeWorld is a gateway with two stored, live sessions A (one turn in
// it) and B, and a credential per column.
type scopeWorld struct {
	gw     *Gateway
	book   *access.Book
	vars   map[string]string
	who    map[string]access.Identity
	nextID int
}

func newScopeWorld(t *testing.T) *scopeWorld {
	t.Helper()
	tbl, st, m := newTestTable(t)
	gw := New(tbl, st, "test", zerolog.Nop(), m)
	t.Cleanup(gw.Close)
	book := access.NewBook(st, zerolog.Nop())
	ctx := context.Background()
	if err := book.SetAccessToken(ctx, "host-1", "admintoken"); err != nil {
		t.Fatal(err)
	}
	gw.SetCredentials(book)
	w := &scopeWorld{gw: gw, book: book, vars: map[string]string{}, who: map[string]access.Identity{}}
	admin, err := book.Verify("admintoken")
	if err != nil {
		t.Fatal(err)
	}
	w.who["admin"] = admin
	c := w.conn(t, "admin")
	for _, s := range []string{"A", "B"} {
		var snap struct {
			SessionID  string `json:"session_id"`
			SessionKey string `json:"session_key"`
		}
		w.call(t, c, wire.MethodCreate, `{"title":"`+s+`"}`, &snap)
		w.vars["r"+s], w.vars["k"+s] = snap.SessionID, snap.SessionKey
	}
	w.call(t, c, wire.MethodSubmit, w.expand(`{"session_id":"$rA","text":"hello"}`), nil)
	c.out.(*notifyingSender).waitFrame(t, `"message.complete"`)
	for col, scopes := range map[string][]string{
		"new": nil, "session:A": {access.SessionScope(w.vars["kA"], false)}, "session:A:view": {access.SessionScope(w.vars["kA"], true)},
		"session:B": {access.SessionScope(w.vars["kB"], false)}, "pty:T": {access.PTYScope("T0ken", false)},
	} {
		name := strings.NewReplacer(":", "-").Replace(col)
		if col == "session:A:view" {
			name = "phone"
		}
		secret, _, err := book.Create(ctx, name, access.KindMade, scopes, 0)
		if err != nil {
			t.Fatal(err)
		}
		if w.who[col], err = book.Verify(secret); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// conn opens a connection with column col's credential.
func (w *scopeWorld) conn(t *testing.T, col string) *conn {
	out := &notifyingSender{sent: make(chan struct{}, 1)}
	w.nextID++
	c := w.gw.newConn(contract.TransportID{Instance: "t", Conn: uint64(w.nextID)}, "ws", out).as(w.who[col])
	t.Cleanup(c.OnClosed)
	return c
}

func (w *scopeWorld) expand(params string) string {
	for k, v := range w.vars {
		params = strings.ReplaceAll(params, "$"+k, v)
	}
	return params
}

// do sends one request on c and returns its response.
func (w *scopeWorld) do(t *testing.T, c *conn, method, params string) (json.RawMessage, *rpcError) {
	t.Helper()
	w.nextID++
	id := fmt.Sprintf("%d", 1000+w.nextID)
	c.handle([]byte(`{"jsonrpc":"2.0","id":` + id + `,"method":"` + method + `","params":` + params + `}`))
	frame := c.out.(*notifyingSender).waitFrame(t, `"id":`+id)
	var r struct {
		Result json.RawMessage `json:"result"`
		Error  *rpcError       `json:"error"`
	}
	if err := json.Unmarshal(frame, &r); err != nil {
		t.Fatalf("%s: %v", frame, err)
	}
	return r.Result, r.Error
}

func (w *scopeWorld) call(t *testing.T, c *conn, method, params string, out any) {
	t.Helper()
	res, rerr := w.do(t, c, method, params)
	if rerr != nil {
		t.Fatalf("%s %s: %d %s", method, params, rerr.Code, rerr.Message)
	}
	if out != nil {
		if err := json.Unmarshal(res, out); err != nil {
			t.Fatal(err)
		}
	}
}

// fingerprint is what a refused call must leave unchanged: the live
// sessions (status, messages, viewers), the stored ones (messages,
// ended) and the credentials (and their scopes).
func (w *scopeWorld) fingerprint(t *testing.T) string {
	var b strings.Builder
	for _, e := range w.gw.table.Active() {
		fmt.Fprintf(&b, "live %s %s %s %d %d\n", e.ID, e.SessionKey, e.Status, e.MessageCount, e.Viewers)
	}
	rows, err := w.gw.store.List(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rows {
		fmt.Fprintf(&b, "stored %s %d %v\n", s.Key, s.MessageCount, s.EndedAt.IsZero())
	}
	var creds []string
	for _, c := range w.book.Credentials() {
		creds = append(creds, c.ID+" "+strings.Join(c.Scopes, ","))
	}
	sort.Strings(creds)
	b.WriteString(strings.Join(creds, "\n"))
	return b.String()
}

// TestScopeTable calls every method with every column's credential on a
// fresh world: an allowed call is not refused (it may still fail for its
// own reason, as a permission answer to no request does), a refused one
// is answered 4030 "forbidden: outside this credential's scope" and
// changes nothing.
func TestScopeTable(t *testing.T) {
	names := make([]string, 0, len(scopeTable))
	for name := range scopeTable {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		row := scopeTable[name]
		for _, col := range scopeColumns {
			t.Run(name+"/"+col, func(t *testing.T) {
				w := newScopeWorld(t)
				c := w.conn(t, col)
				before := w.fingerprint(t)
				res, rerr := w.do(t, c, name, w.expand(row.params))
				if slices.Contains(row.allowed, col) {
					if rerr != nil && rerr.Code == wire.CodeForbidden {
						t.Fatalf("allowed call refused: %d %s", rerr.Code, rerr.Message)
					}
					if want, ok := row.listed[col]; ok {
						var l struct {
							Sessions []json.RawMessage `json:"sessions"`
						}
						if err := json.Unmarshal(res, &l); err != nil || len(l.Sessions) != want {
							t.Fatalf("listed %d sessions (%s), want %d", len(l.Sessions), res, want)
						}
					}
					return
				}
				if rerr == nil || rerr.Code != wire.CodeForbidden || rerr.Message != "forbidden: outside this credential's scope" {
					t.Fatalf("got %s %+v, want 4030 %q", res, rerr, "forbidden: outside this credential's scope")
				}
				// Let anything the call might have started settle.
				w.do(t, w.conn(t, "admin"), wire.MethodActiveList, `{}`)
				if after := w.fingerprint(t); after != before {
					t.Fatalf("a refused call changed the host:\nbefore\n%s\nafter\n%s", before, after)
				}
			})
		}
	}
}

// TestScopeNewReachesWhatItMade: a "new" credential reaches the session
// it created — on the connection that made it at once, on another of its
// connections once granted — and still nothing else; the grant shows in
// its scopes.
func TestScopeNewReachesWhatItMade(t *testing.T) {
	w := newScopeWorld(t)
	c := w.conn(t, "new")
	var snap struct {
		SessionID  string `json:"session_id"`
		SessionKey string `json:"session_key"`
	}
	w.call(t, c, wire.MethodCreate, `{}`, &snap)
	w.call(t, c, wire.MethodSubmit, `{"session_id":"`+snap.SessionID+`","text":"mine"}`, nil)
	w.gw.grants.Wait()
	if s := w.book.Scopes(w.who["new"].Credential); !slices.Contains(s, access.SessionScope(snap.SessionKey, false)) {
		t.Fatalf("the new credential's scopes %v lack its session", s)
	}
	other := w.conn(t, "new")
	w.call(t, other, wire.MethodResume, `{"session_id":"`+snap.SessionKey+`"}`, nil)
	var list struct {
		Sessions []struct {
			ID string `json:"id"`
		} `json:"sessions"`
	}
	w.call(t, other, wire.MethodList, `{}`, &list)
	if len(list.Sessions) != 1 || list.Sessions[0].ID != snap.SessionKey {
		t.Fatalf("the new credential lists %+v, want its one session", list.Sessions)
	}
	if _, rerr := w.do(t, other, wire.MethodResume, w.expand(`{"session_id":"$kA"}`)); rerr == nil || rerr.Code != wire.CodeForbidden {
		t.Fatalf("resume of another's session: %+v, want 4030", rerr)
	}
	// By title: another's title is refused as if it did not exist.
	if _, rerr := w.do(t, other, wire.MethodResume, `{"session_id":"A"}`); rerr == nil || rerr.Code != wire.CodeForbidden {
		t.Fatalf("resume of another's session by title: %+v, want 4030", rerr)
	}
}

// TestScopeRevokedCredentialCanDoNothing: a connection whose credential
// was revoked is refused everything at once (its socket is also closed
// by the link's sweep).
func TestScopeRevokedCredentialCanDoNothing(t *testing.T) {
	w := newScopeWorld(t)
	c := w.conn(t, "session:A")
	w.call(t, c, wire.MethodRuns, w.expand(`{"session_id":"$rA"}`), nil)
	if _, err := w.book.Revoke(context.Background(), w.who["session:A"].Credential); err != nil {
		t.Fatal(err)
	}
	if _, rerr := w.do(t, c, wire.MethodRuns, w.expand(`{"session_id":"$rA"}`)); rerr == nil || rerr.Code != wire.CodeForbidden {
		t.Fatalf("after revoke: %+v, want 4030", rerr)
	}
	// The access token is changed, not revoked: refused, and still valid.
	admin := w.conn(t, "admin")
	if _, rerr := w.do(t, admin, wire.MethodCredentialRevoke, `{"credential":"admin"}`); rerr == nil || rerr.Code != wire.CodeInvalidParams {
		t.Fatalf("revoking the access token: %+v, want -32602", rerr)
	}
	if _, err := w.book.Verify("admintoken"); err != nil {
		t.Fatalf("the access token after a refused revoke: %v", err)
	}

}
