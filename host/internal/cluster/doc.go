// Package cluster shares tether's session table between hosts on NATS
// JetStream (tether serve --cluster). Node is one host's membership: it
// starts the embedded server if asked, connects, opens the cluster's
// stores, and serves the relay. Its parts, each a package below:
//
//   - embedded: a NATS server with JetStream inside the host process,
//     alone or routed with others, and who may use the bus (the
//     embedded server's passwords derived from the cluster's secret, its
//     TLS, the credentials a host of an external cluster presents);
//   - owners: the session ownership table on the KV bucket
//     tether_sessions (owners.KV, wrapped by owners.Takeover for the
//     table), the hosts' heartbeats (owners.Registry, bucket
//     tether_hosts) and the PTYs' hosts (owners.PTYPlaces, bucket
//     tether_ptys);
//   - jsstore: host/store's stored sessions, display rows, runs and event
//     journal on JetStream (jsstore.Store), so that any host can rebuild
//     any session, and the credentials every host accepts
//     (jsstore.ClientCredentials, bucket tether_credentials);
//   - relay: connections carried between hosts on the NATS subjects
//     tether.relay.<host>.in and .back: a client's /api/ws socket that
//     binds a session live elsewhere, or its /api/pty socket of a PTY
//     elsewhere, gets a leg to that host, which serves it through the same
//     endpoint as its own sockets (transport name link.RelayTransport).
//     A leg's open carries the client's identity as its own host verified
//     it (header Tether-Identity); the serving host applies it and checks
//     no credential itself: whoever can publish on the cluster's subjects
//     is a host;
//   - bus: what the JetStream users share (a KV bucket read from its
//     stream leader, busy writes asked again, the token rule);
//   - clustertest: the servers the parts' tests start.
//
// The parts never import this package (internal/deptest). A part does
// not own the connection it is given, and embedded.Server not its
// clients: the node closes connections, then shuts the server down.
package cluster
