package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// tokenCmd is tether token: create, list and revoke the host's scoped
// credentials (docs/SECURITY.md, "Credentials").
func tokenCmd(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: tether token create|list|revoke (see tether token create -h)")
		return 2
	}
	switch args[0] {
	case "create":
		return tokenCreate(args[1:])
	case "list":
		return tokenList(args[1:])
	case "revoke":
		return tokenRevoke(args[1:])
	case "-h", "--help", "-help", "help":
		fmt.Println("usage: tether token create --name NAME [--scope SCOPE]... [--ttl D] | list [--json] | revoke ID|NAME")
		return 0
	}
	fmt.Fprintf(os.Stderr, "tether token: unknown command %q (create, list or revoke)\n", args[0])
	return 2
}

// parseTTL takes a Go duration (90m, 12h) or whole days (7d); 0 or ""
// is no expiry.
func parseTTL(s string) (time.Duration, error) {
	if s == "" || s == "0" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("--ttl %q: want a duration such as 90m, 12h or 7d", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("--ttl %q: want a duration such as 90m, 12h or 7d", s)
	}
	if d > 0 && d < time.Second {
		return 0, fmt.Errorf("--ttl %q: at least a second", s)
	}
	return d, nil
}

// credentialCall dials the host as cmd and runs f; it prints f's error
// and returns the exit status.
func credentialCall(tf tokenFlags, cmd string, f func(ctx context.Context, c *client.Conn) error) int {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c := tf.dial(ctx, cmd)
	if c == nil {
		return 1
	}
	defer c.Close()
	if err := f(ctx, c); err != nil {
		if client.IsCode(err, wire.CodeForbidden) {
			fmt.Fprintf(os.Stderr, "%s: %v (only the access token, scope admin, manages credentials)\n", cmd, err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "%s: %v\n", cmd, err)
		return 1
	}
	return 0
}

func when(unix int64) string {
	if unix == 0 {
		return "never"
	}
	return time.Unix(unix, 0).UTC().Format("2006-01-02 15:04 UTC")
}

func tokenCreate(args []string) int {
	fs := flag.NewFlagSet("tether token create", flag.ContinueOnError)
	tf := addTokenFlags(fs)
	name := fs.String("name", "", "who or what holds it (required): shown by tether token list and in who-did-what")
	var scopes strList
	fs.Var(&scopes, "scope", "what it may do (repeatable): admin, new, session:KEY[:view], pty:TOKEN[:view] (default new)")
	ttl := fs.String("ttl", "", "how long it lasts, e.g. 12h or 7d (default: until revoked)")
	asJSON := fs.Bool("json", false, "print the credential, its secret and URL as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tether token create --name NAME [--scope SCOPE]... [--ttl D] [--json]

Makes a credential with a name, scopes and an expiry, and prints its
secret once, with a URL that opens the page with it. Only its hash is
stored; revoke it with tether token revoke. The host is found as for
tether sessions, and only its access token may do this.

flags:
`)
		fs.PrintDefaults()
	}
	if code, done := parseOrExit(fs, args, "tether token create"); done {
		return code
	}
	if *name == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "tether token create: --name NAME is required, and nothing else")
		return 2
	}
	d, err := parseTTL(*ttl)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether token create:", err)
		return 2
	}
	return credentialCall(tf, "tether token create", func(ctx context.Context, c *client.Conn) error {
		r, err := c.CredentialCreate(ctx, wire.CredentialCreateParams{Name: *name, Scopes: scopes, TTLSeconds: int64(d / time.Second)})
		if err != nil {
			return err
		}
		return printCreated(r, *asJSON)
	})
}

func printCreated(r wire.CredentialCreated, asJSON bool) error {
	if asJSON {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		fmt.Println(string(b))
		return nil
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "id\t%s\n", r.Credential.ID)
	fmt.Fprintf(w, "name\t%s\n", r.Credential.Name)
	fmt.Fprintf(w, "scopes\t%s\n", strings.Join(r.Credential.Scopes, " "))
	fmt.Fprintf(w, "expires\t%s\n", when(r.Credential.Expires))
	fmt.Fprintf(w, "secret\t%s\t(shown this once)\n", r.Secret)
	if r.URL != "" {
		fmt.Fprintf(w, "url\t%s\n", r.URL)
	}
	return w.Flush()
}

func tokenList(args []string) int {
	fs := flag.NewFlagSet("tether token list", flag.ContinueOnError)
	tf := addTokenFlags(fs)
	asJSON := fs.Bool("json", false, "print the credentials as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tether token list [--json]

Lists the host's credentials: id, name, kind, scopes, when made, when
they expire and when last used — never a secret. Browsers' page sign-ins
are not listed; they end with the credential they were made from.

flags:
`)
		fs.PrintDefaults()
	}
	if code, done := parseOrExit(fs, args, "tether token list"); done {
		return code
	}
	return credentialCall(tf, "tether token list", func(ctx context.Context, c *client.Conn) error {
		creds, err := c.CredentialList(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			b, err := json.MarshalIndent(creds, "", "  ")
			if err != nil {
				return err
			}
			fmt.Println(string(b))
			return nil
		}
		w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tNAME\tKIND\tSCOPES\tCREATED\tEXPIRES\tLAST USED")
		for _, cr := range creds {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cr.ID, cr.Name, cr.Kind, strings.Join(cr.Scopes, " "), when(cr.Created), when(cr.Expires), when(cr.LastUsed))
		}
		return w.Flush()
	})
}

func tokenRevoke(args []string) int {
	fs := flag.NewFlagSet("tether token revoke", flag.ContinueOnError)
	tf := addTokenFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tether token revoke ID|NAME

Revokes a credential (or every credential of that name) on the host and,
in a cluster, on every host: each socket opened with it is closed (4401
"credential revoked") within a second, and it is refused from then on.

flags:
`)
		fs.PrintDefaults()
	}
	// The ID or NAME may come before the flags.
	var words []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		words, args = append(words, args[0]), args[1:]
	}
	if code, done := parseOrExit(fs, args, "tether token revoke"); done {
		return code
	}
	words = append(words, fs.Args()...)
	if len(words) != 1 {
		fmt.Fprintln(os.Stderr, "tether token revoke: give one ID or NAME")
		return 2
	}
	return credentialCall(tf, "tether token revoke", func(ctx context.Context, c *client.Conn) error {
		gone, err := c.CredentialRevoke(ctx, words[0])
		if err != nil {
			return err
		}
		for _, cr := range gone {
			fmt.Printf("revoked %s (%s)\n", cr.ID, cr.Name)
		}
		return nil
	})
}

// shareCmd is tether share pty|session: a credential for exactly one
// terminal or chat, and the URL that opens the page on it.
func shareCmd(args []string) int {
	fs := flag.NewFlagSet("tether share", flag.ContinueOnError)
	tf := addTokenFlags(fs)
	view := fs.Bool("view", false, "read-only: watch the terminal or chat, never type or prompt")
	ttl := fs.String("ttl", "", "how long the link works, e.g. 1h or 7d (default: until revoked)")
	name := fs.String("name", "", "the credential's name, shown in tether token list and who-did-what (default share-XXXXXX)")
	asJSON := fs.Bool("json", false, "print the credential, its secret and URL as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tether share pty ATTACH_TOKEN [--view] [--ttl D] [--name N]
       tether share session KEY [--view] [--ttl D] [--name N]

Prints a URL that opens the page on that terminal or chat, with a
credential for exactly that (read-only with --view). Hand it to a phone
or a colleague; tether token revoke NAME ends it, and its sockets with
it.

flags:
`)
		fs.PrintDefaults()
	}
	// The flags may come after the two words.
	var words []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		words, args = append(words, args[0]), args[1:]
	}
	if code, done := parseOrExit(fs, args, "tether share"); done {
		return code
	}
	words = append(words, fs.Args()...)
	if len(words) != 2 || (words[0] != "pty" && words[0] != "session") {
		fmt.Fprintln(os.Stderr, "tether share: say what: pty ATTACH_TOKEN or session KEY")
		return 2
	}
	d, err := parseTTL(*ttl)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether share:", err)
		return 2
	}
	scope := words[0] + ":" + words[1]
	if *view {
		scope += ":view"
	}
	return credentialCall(tf, "tether share", func(ctx context.Context, c *client.Conn) error {
		r, err := c.CredentialCreate(ctx, wire.CredentialCreateParams{Name: *name, Scopes: []string{scope}, TTLSeconds: int64(d / time.Second), Share: true})
		if err != nil {
			return err
		}
		if *asJSON {
			return printCreated(r, true)
		}
		if r.URL == "" {
			fmt.Println(r.Secret)
		} else {
			fmt.Println(r.URL)
		}
		what := "read and write"
		if *view {
			what = "read-only"
		}
		fmt.Fprintf(os.Stderr, "tether share: %s, %s %s, expires %s; end it with: tether token revoke %s\n", r.Credential.Name, what, scope, when(r.Credential.Expires), r.Credential.ID)
		return nil
	})
}

// parseOrExit parses fs; done reports that the command ends with code
// (help asked for: 0; a bad flag: 2).
func parseOrExit(fs *flag.FlagSet, args []string, cmd string) (code int, done bool) {
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, true
		}
		fmt.Fprintln(os.Stderr, cmd+":", err)
		return 2, true
	}
	return 0, false
}
