package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/host"
	"github.com/tether-agent/tether/wire"
)

// defaultURL is the host client commands reach when neither --url nor a
// state dir's recorded address says otherwise.
const defaultURL = "http://127.0.0.1:7717"

// tokenFlags are the flags every client command takes to find its host
// and the access token without it appearing on a command line: --url,
// else the address the host serving --state-dir (or the default state
// dir) recorded there; TETHER_TOKEN, else that host's token file
// (--token-file, or <state-dir>/token). --token still works, but puts
// the token where `ps` shows it.
type tokenFlags struct {
	url       *string
	token     *string
	tokenFile *string
	stateDir  *string
}

func addTokenFlags(fs *flag.FlagSet) tokenFlags {
	return tokenFlags{
		url:       fs.String("url", "", "URL of the running host (default: the address the host serving --state-dir recorded there, else "+defaultURL+")"),
		token:     fs.String("token", "", "access token (prefer TETHER_TOKEN, or let the command read the token file: a flag's value is visible to every user in ps)"),
		tokenFile: fs.String("token-file", "", "the host's token file, read when no token is given (default <state-dir>/token)"),
		stateDir:  fs.String("state-dir", defaultStateDir(), "the host's state dir: its recorded address is used when no --url is given, its token file when no token is"),
	}
}

// base returns the URL of the host to reach: --url when given, else the
// one the host serving the state dir recorded (host.URLFile), else
// defaultURL; from says where it came from, for messages.
func (f tokenFlags) base() (base, from string) {
	if *f.url != "" {
		return *f.url, ""
	}
	if u, err := host.ReadURL(*f.stateDir); err == nil && u != "" {
		return u, filepath.Join(*f.stateDir, host.URLFile)
	}
	return defaultURL, ""
}

// connectHelp says why a connection to base failed beyond the error:
// the host that recorded it is gone, or none runs on the state dir.
func (f tokenFlags) connectHelp(from string) string {
	if *f.url != "" {
		return ""
	}
	if pid, err := host.LockHolder(*f.stateDir); err == nil && pid == 0 {
		return fmt.Sprintf(" (no host is running on %s: start tether serve, or give --url)", *f.stateDir)
	}
	if from != "" {
		return " (the address recorded in " + from + ")"
	}
	return ""
}

// resolve returns the token to present: --token/TETHER_TOKEN, else one
// carried by the URL (urlToken), else the token file's; and the file it
// would have read, for messages.
func (f tokenFlags) resolve(urlToken string) (token, file string) {
	file = *f.tokenFile
	if file == "" {
		file = filepath.Join(*f.stateDir, "token")
	}
	switch {
	case *f.token != "":
		return *f.token, file
	case urlToken != "":
		return urlToken, file
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", file
	}
	return strings.TrimSpace(string(b)), file
}

// tokenHelp is the one message every client command gives when the host
// refuses the access token (4401), or none was found.
func tokenHelp(token, file string) string {
	if file == "" {
		file = "<state-dir>/token"
	}
	if token == "" {
		return "no access token: set TETHER_TOKEN, or run this as the host's user on its machine so that its token file (" + file + ") is read"
	}
	return "the host refused the access token (4401 unauthorized): set TETHER_TOKEN to the host's token, or run this as the host's user on its machine so that its token file (" + file + ") is read"
}

// dial connects a client command (named cmd, e.g. "tether sessions") to the
// JSON-RPC gateway of the host base finds, with the token resolve finds. On
// failure it prints the one-line reason (tokenHelp for a refused or
// missing token) and returns nil: the command exits 1.
func (f tokenFlags) dial(ctx context.Context, cmd string) *client.Conn {
	base, from := f.base()
	_, urlToken, _ := client.Endpoint(base, wire.PathRPC)
	token, file := f.resolve(urlToken)
	c, err := client.Dial(ctx, base, client.Options{Token: token})
	var ce *client.CloseError
	switch {
	case errors.As(err, &ce) && ce.Code == wire.CloseUnauthorized:
		fmt.Fprintln(os.Stderr, cmd+":", tokenHelp(token, file)+f.mismatchHelp())
		return nil
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: connecting to %s: %v%s\n", cmd, redactToken(base), err, f.connectHelp(from))
		return nil
	}
	return c
}

// mismatchHelp says, after a refused token, when --url names another
// host than the one serving --state-dir (whose token file was read).
func (f tokenFlags) mismatchHelp() string {
	if *f.url == "" || *f.token != "" {
		return ""
	}
	if u, err := host.ReadURL(*f.stateDir); err == nil && u != "" && !sameHostURL(u, *f.url) {
		return fmt.Sprintf("; note: --url %s is not the host serving %s (%s), whose token file was read: give that host's --state-dir, or leave out --url", redactToken(*f.url), *f.stateDir, u)
	}
	return ""
}

// sameHostURL reports whether two http(s)/ws(s) URLs name the same
// host and port.
func sameHostURL(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	return err1 == nil && err2 == nil && ua.Host == ub.Host
}

// redactToken is u with the value of a token query parameter hidden.
func redactToken(u string) string {
	before, q, ok := strings.Cut(u, "?")
	if !ok {
		return u
	}
	vals, err := url.ParseQuery(q)
	if err != nil || !vals.Has("token") {
		return u
	}
	vals.Set("token", "REDACTED")
	return before + "?" + vals.Encode()
}
