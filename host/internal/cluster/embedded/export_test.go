package embedded

// The unexported parts the external tests check.
var (
	Derive   = derive
	HostPort = hostPort
	RouteURL = routeURL
)

// The user names of the server's two passwords.
const (
	ClientUser = clientUser
	RouteUser  = routeUser
)

// ClientPass is e's client password.
func ClientPass(e *Server) string { return e.clientPass }
