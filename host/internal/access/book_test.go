package access

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

func newTestBook(t testing.TB, token string) (*Book, *memStore, *time.Time) {
	t.Helper()
	st := newMemStore()
	b := NewBook(st, zerolog.Nop())
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	b.now = func() time.Time { return now }
	if err := b.SetAccessToken(context.Background(), AdminName, token); err != nil {
		t.Fatal(err)
	}
	return b, st, &now
}

func TestBookVerify(t *testing.T) {
	b, _, _ := newTestBook(t, "tok-1")
	who, err := b.Verify("tok-1")
	if err != nil || who.Name != AdminName || !who.Admin() || who.Credential != AdminName {
		t.Fatalf("Verify(token) = %+v, %v; want admin", who, err)
	}
	for _, bad := range []string{"", "tok-", "tok-1x", "TOK-1", Hash("tok-1")} {
		if who, err := b.Verify(bad); !errors.Is(err, ErrUnknownCredential) || !who.IsZero() {
			t.Errorf("Verify(%q) = %+v, %v; want ErrUnknownCredential", bad, who, err)
		}
	}
}

// TestBookTokenChanged: a new access token replaces the old one, and
// every page sign-in made from the old one stops being valid (and is
// pruned from the store).
func TestBookTokenChanged(t *testing.T) {
	b, st, _ := newTestBook(t, "old")
	ctx := context.Background()
	who, _ := b.Verify("old")
	page, err := b.SignIn(ctx, who)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.Verify(page); err != nil || got.Name != AdminName || !got.Admin() || got.Credential == AdminName {
		t.Fatalf("Verify(page) = %+v, %v; want admin through a page credential", got, err)
	}
	if err := b.SetAccessToken(ctx, AdminName, "new"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"old", page} {
		if _, err := b.Verify(s); !errors.Is(err, ErrUnknownCredential) {
			t.Errorf("after the change, Verify(%s) = %v; want ErrUnknownCredential", s, err)
		}
	}
	if _, err := b.Verify("new"); err != nil {
		t.Errorf("Verify(new) = %v", err)
	}
	if err := b.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	cs, _ := st.Credentials(ctx)
	if len(cs) != 1 || cs[0].Hash != Hash("new") {
		t.Errorf("stored after prune: %+v; want only the new token", cs)
	}
}

// TestBookPageExpiry: a page sign-in lasts PageTTL, then is refused as
// expired and pruned.
func TestBookPageExpiry(t *testing.T) {
	b, st, now := newTestBook(t, "tok")
	ctx := context.Background()
	who, _ := b.Verify("tok")
	page, err := b.SignIn(ctx, who)
	if err != nil {
		t.Fatal(err)
	}
	*now = now.Add(PageTTL - time.Second)
	if _, err := b.Verify(page); err != nil {
		t.Fatalf("just before expiry: %v", err)
	}
	*now = now.Add(time.Second)
	if _, err := b.Verify(page); !errors.Is(err, ErrCredentialExpired) {
		t.Fatalf("at expiry: %v, want ErrCredentialExpired", err)
	}
	if err := b.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if cs, _ := st.Credentials(ctx); len(cs) != 1 {
		t.Errorf("stored after prune: %d credentials, want 1 (the token)", len(cs))
	}
}

// TestBookPagesBounded: signing in again and again keeps at most
// maxPagesPerParent sign-ins of one credential; the oldest go.
func TestBookPagesBounded(t *testing.T) {
	b, st, now := newTestBook(t, "tok")
	ctx := context.Background()
	who, _ := b.Verify("tok")
	var pages []string
	for range maxPagesPerParent + 5 {
		*now = now.Add(time.Second)
		p, err := b.SignIn(ctx, who)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, p)
	}
	for i, p := range pages {
		_, err := b.Verify(p)
		if old := i < 5; old != (err != nil) {
			t.Errorf("page %d: Verify = %v, want refused=%v", i, err, old)
		}
	}
	if cs, _ := st.Credentials(ctx); len(cs) != maxPagesPerParent+1 {
		t.Errorf("stored: %d, want %d", len(cs), maxPagesPerParent+1)
	}
}

// TestBookStoreFailure: a page sign-in that cannot be stored is not
// made; the access token is accepted even when it cannot be stored.
func TestBookStoreFailure(t *testing.T) {
	st := newMemStore()
	st.fail = errors.New("disk full")
	b := NewBook(st, zerolog.Nop())
	if err := b.SetAccessToken(context.Background(), AdminName, "tok"); err == nil {
		t.Error("SetAccessToken: want the store's error")
	}
	who, err := b.Verify("tok")
	if err != nil {
		t.Fatalf("Verify(token) after a failed store: %v", err)
	}
	if _, err := b.SignIn(context.Background(), who); err == nil {
		t.Error("SignIn with a failing store: want an error")
	}
	if n := len(b.Credentials()); n != 1 {
		t.Errorf("book holds %d credentials, want 1", n)
	}
}

func TestCookieName(t *testing.T) {
	for bound, want := range map[string]string{
		"127.0.0.1:7717": "tether_7717",
		"[::1]:8080":     "tether_8080",
		"0.0.0.0:1":      "tether_1",
	} {
		if got := CookieName(bound); got != want {
			t.Errorf("CookieName(%q) = %q, want %q", bound, got, want)
		}
	}
	u1, u2 := CookieName("unix:/a.sock"), CookieName("unix:/b.sock")
	if !strings.HasPrefix(u1, "tether_unix_") || u1 == u2 {
		t.Errorf("unix cookie names %q, %q: want distinct tether_unix_… names", u1, u2)
	}
}

// TestPageSignIn follows the page cookie: ?token= signs a browser in
// with a cookie named for the listener holding a page credential (not
// the token); that cookie alone is then accepted; another port's cookie
// is not this listener's; the old cookie is accepted and replaced.
func TestPageSignIn(t *testing.T) {
	a := withToken(t, "tok", &Access{Bound: "127.0.0.1:7717", Secure: true})
	ctx := context.Background()
	page := func(query, cookie string) contract.Event {
		ev := contract.Event{Kind: contract.EventOpened, Page: true, Path: "/", Query: query, Host: "127.0.0.1:7717",
			Remote: "127.0.0.1:1", Header: map[string][]string{}}
		if cookie != "" {
			ev.Header["Cookie"] = []string{cookie}
		}
		return ev
	}

	ev := page("token=tok", "")
	d := a.Decide(ev)
	if d.Code != 0 || d.Via != ViaQuery || !a.NeedsCookie(ev, d) {
		t.Fatalf("?token=: %+v, needs cookie %v; want admitted by query, needing a cookie", d, a.NeedsCookie(ev, d))
	}
	hdr, err := a.PageCookies(ctx, ev, d)
	if err != nil {
		t.Fatal(err)
	}
	set := hdr["Set-Cookie"]
	if len(set) != 1 {
		t.Fatalf("Set-Cookie %q, want one", set)
	}
	c, err := http.ParseSetCookie(set[0])
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "tether_7717" || c.Value == "tok" || c.Value == "" || !c.HttpOnly || !c.Secure ||
		c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.MaxAge != int(PageTTL/time.Second) {
		t.Errorf("cookie %+v: want tether_7717, a page credential (not the token), HttpOnly, Secure, Strict, Path=/, 400 days", c)
	}
	cookie := c.Name + "=" + c.Value

	// The cookie alone is accepted, as admin, and asks for no new one.
	ev = page("", cookie)
	if d := a.Decide(ev); d.Code != 0 || d.Via != ViaCookie || !d.Who.Admin() || a.NeedsCookie(ev, d) {
		t.Errorf("cookie: %+v; want admitted by the page cookie as admin, no new cookie", d)
	}
	// ?token= with the cookie of that token makes no second sign-in.
	ev = page("token=tok", cookie)
	if d := a.Decide(ev); d.Code != 0 || a.NeedsCookie(ev, d) {
		t.Errorf("?token= with its cookie: %+v; want no new sign-in", d)
	}
	// A wrong ?token= decides alone, whatever the cookie.
	if d := a.Decide(page("token=nope", cookie)); d.Code != wire.CloseUnauthorized || !d.Given {
		t.Errorf("wrong ?token= with a good cookie: %+v; want 4401", d)
	}
	// Another listener's cookie (same value) is not this one's.
	if d := a.Decide(page("", "tether_7718="+c.Value)); d.Code != wire.CloseUnauthorized || d.Given {
		t.Errorf("another port's cookie: %+v; want 4401 with no credential given", d)
	}
	// The token itself in this listener's cookie is a credential too
	// (what a browser of an older tether may have), but a page cookie
	// that is not a credential is refused.
	if d := a.Decide(page("", "tether_7717=garbage")); d.Code != wire.CloseUnauthorized || !d.Given {
		t.Errorf("a bad page cookie: %+v; want 4401", d)
	}
	// The old cookie is accepted and replaced by the listener's.
	ev = page("", "tether_token=tok")
	d = a.Decide(ev)
	if d.Code != 0 || d.Via != ViaLegacy || !a.NeedsCookie(ev, d) {
		t.Fatalf("old cookie: %+v; want admitted, needing the new cookie", d)
	}
	hdr, err = a.PageCookies(ctx, ev, d)
	if err != nil {
		t.Fatal(err)
	}
	if set := hdr["Set-Cookie"]; len(set) != 2 || !strings.HasPrefix(set[0], "tether_7717=") ||
		!strings.HasPrefix(set[1], "tether_token=;") || !strings.Contains(set[1], "Max-Age=0") {
		t.Errorf("old cookie: Set-Cookie %q; want the new cookie and the old one cleared", set)
	}
}
