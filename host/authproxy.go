package host

import "github.com/tether-agent/tether/host/internal/access"

// AuthProxy is a reverse proxy that authenticates people and names the
// user in a request header (TransportSettings.AuthProxy): requests from
// its addresses that carry the header are that user; from any other
// address the header is ignored (docs/SECURITY.md).
type AuthProxy = access.Proxy

// ErrAuthProxy is a bad --auth-proxy-* flag or users file.
var ErrAuthProxy = access.ErrProxyConfig

// NewAuthProxy makes the AuthProxy of --auth-proxy-header header,
// --auth-proxy-from from (CIDRs or addresses, each possibly a comma
// list) and --auth-proxy-users usersFile ("": every user is admin). It
// returns nil when none of them is given; one without the others is an
// error, as is a users file that does not parse or that others can
// change.
func NewAuthProxy(header string, from []string, usersFile string) (*AuthProxy, error) {
	if header == "" && len(from) == 0 && usersFile == "" {
		return nil, nil
	}
	p, err := access.NewProxy(header, from, nil)
	if err != nil {
		return nil, err
	}
	if usersFile != "" {
		if p.Users, err = access.ReadProxyUsers(usersFile); err != nil {
			return nil, err
		}
	}
	return p, nil
}
