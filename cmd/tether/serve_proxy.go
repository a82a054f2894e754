package main

import (
	"flag"

	"github.com/tether-agent/tether/host"
)

// proxyFlags are tether serve's --auth-proxy-* flags: people a reverse
// proxy authenticated (docs/SECURITY.md, "Behind a reverse proxy").
type proxyFlags struct {
	header, users string
	from          strList
}

// addProxyFlags defines the --auth-proxy-* flags on fs.
func addProxyFlags(fs *flag.FlagSet) *proxyFlags {
	p := &proxyFlags{}
	fs.StringVar(&p.header, "auth-proxy-header", "", "request header in which a reverse proxy that authenticates people names the user (e.g. X-Forwarded-User); honoured only from --auth-proxy-from, where it wins over a token")
	fs.Var(&p.from, "auth-proxy-from", "the reverse proxy's addresses: a `CIDR` or address, or a comma list (repeatable); from any other peer --auth-proxy-header is ignored")
	fs.StringVar(&p.users, "auth-proxy-users", "", "`file` of the users the proxy may name, one a line: USER SCOPE... (e.g. \"alice admin\", \"bob session:KEY:view new\"; # comments); others are refused (default: every user is admin)")
	return p
}

// config is the proxy the flags describe, nil when none is given.
func (p *proxyFlags) config() (*host.AuthProxy, error) {
	return host.NewAuthProxy(p.header, p.from, p.users)
}
