package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/host"
	"github.com/tether-agent/tether/internal/statedir"
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
// would have read, for messages. err says why a token file that is there
// was not read (readTokenFile's rules): the command stops with it.
func (f tokenFlags) resolve(urlToken string) (token, file string, err error) {
	file = *f.tokenFile
	if file == "" {
		file = filepath.Join(*f.stateDir, "token")
	}
	switch {
	case *f.token != "":
		return *f.token, file, nil
	case urlToken != "":
		return urlToken, file, nil
	}
	t, _, err := readTokenFile(*f.stateDir, file, false, zerolog.Nop())
	if errors.Is(err, fs.ErrNotExist) {
		return "", file, nil
	}
	return t, file, err
}

// readTokenFile reads the access token from the token file at path. One
// in the state dir stateDir is read by the state dir's rules: never
// through a symbolic link (a link there, dangling or not, is refused at
// once), and only when it, and the state dir, are this user's and
// closed to writes by others. One elsewhere is the operator's choice: it
// may be a link (a Kubernetes secret mount is one) and is read through
// it. Either way it must be a regular file (a FIFO would block the read)
// holding a token. With mend, a file that others can read is made 0600,
// through the descriptor read and never through a link, and said at info
// level. A missing file is an error wrapping fs.ErrNotExist.
func readTokenFile(stateDir, path string, mend bool, log zerolog.Logger) (token string, link bool, err error) {
	var f *os.File
	if statedir.Within(stateDir, path) {
		if err := statedir.CheckTop(stateDir); err != nil {
			return "", false, fmt.Errorf("token file %s: %w", path, err)
		}
		if f, err = statedir.OpenFile(path, os.O_RDONLY, 0); err != nil {
			return "", false, fmt.Errorf("token file: %w", err)
		}
	} else {
		fi, err := os.Lstat(path)
		if err != nil {
			return "", false, fmt.Errorf("token file: %w", err)
		}
		link = fi.Mode()&fs.ModeSymlink != 0
		flag := os.O_RDONLY | syscall.O_NONBLOCK
		if !link {
			flag |= syscall.O_NOFOLLOW
		}
		f, err = os.OpenFile(path, flag, 0)
		if link && errors.Is(err, fs.ErrNotExist) {
			target, _ := os.Readlink(path)
			return "", true, fmt.Errorf("token file %s is a symbolic link to %s, which does not exist; tether never creates a file through a link: make the file it points at, or point --token-file elsewhere", path, target)
		}
		if err != nil {
			return "", link, fmt.Errorf("token file: %w", err)
		}
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			f.Close()
			return "", link, fmt.Errorf("token file %s is not a regular file; point --token-file at one", path)
		}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return "", link, fmt.Errorf("token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", link, fmt.Errorf("token file %s is empty: put a token in it, or remove it to have one made", path)
	}
	if !mend {
		return t, link, nil
	}
	if link {
		if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
			log.Info().Str("file", path).Msgf("token file is a symbolic link to a file others can read (mode %04o); tether does not chmod through a link", fi.Mode().Perm())
		}
		return t, link, nil
	}
	was, changed, err := statedir.MakePrivate(f)
	if err != nil {
		return "", link, fmt.Errorf("token file %s: readable by others and cannot be made 0600: %w", path, err)
	}
	if changed {
		log.Info().Str("file", path).Str("was", fmt.Sprintf("%04o", was)).Msg("token file was readable by others; made it 0600")
	}
	return t, link, nil
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
	token, file, err := f.resolve(urlToken)
	if err != nil {
		fmt.Fprintln(os.Stderr, cmd+":", err)
		return nil
	}
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
