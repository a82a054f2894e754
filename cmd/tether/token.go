package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// tokenFlags are the flags every client command takes to find the access
// token without it appearing on a command line: TETHER_TOKEN, else the
// token file of a host on this machine (--token-file, or <state-dir>/token
// of --state-dir or the default state dir). --token still works, but puts
// the token where `ps` shows it.
type tokenFlags struct {
	token     *string
	tokenFile *string
	stateDir  *string
}

func addTokenFlags(fs *flag.FlagSet) tokenFlags {
	return tokenFlags{
		token:     fs.String("token", "", "access token (prefer TETHER_TOKEN, or let the command read the token file: a flag's value is visible to every user in ps)"),
		tokenFile: fs.String("token-file", "", "the host's token file, read when no token is given (default <state-dir>/token)"),
		stateDir:  fs.String("state-dir", defaultStateDir(), "the host's state dir, whose token file is read when no token is given"),
	}
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
// JSON-RPC gateway of the host at base with the token resolve finds. On
// failure it prints the one-line reason (tokenHelp for a refused or
// missing token) and returns nil: the command exits 1.
func (f tokenFlags) dial(ctx context.Context, cmd, base string) *client.Conn {
	_, urlToken, _ := client.Endpoint(base, wire.PathRPC)
	token, file := f.resolve(urlToken)
	c, err := client.Dial(ctx, base, client.Options{Token: token})
	var ce *client.CloseError
	switch {
	case errors.As(err, &ce) && ce.Code == wire.CloseUnauthorized:
		fmt.Fprintln(os.Stderr, cmd+":", tokenHelp(token, file))
		return nil
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: connecting to %s: %v\n", cmd, base, err)
		return nil
	}
	return c
}
