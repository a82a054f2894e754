package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/internal/statedir"
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
// JSON-RPC gateway of the host at base with the token resolve finds. On
// failure it prints the one-line reason (tokenHelp for a refused or
// missing token) and returns nil: the command exits 1.
func (f tokenFlags) dial(ctx context.Context, cmd, base string) *client.Conn {
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
		fmt.Fprintln(os.Stderr, cmd+":", tokenHelp(token, file))
		return nil
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: connecting to %s: %v\n", cmd, base, err)
		return nil
	}
	return c
}
