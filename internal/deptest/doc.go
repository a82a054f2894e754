// Package deptest holds the test that enforces the import boundaries
// between tether's packages (host, plugins, contract, wire, client,
// testing; docs/ARCHITECTURE.md lists them). It has no
// non-test code.
package deptest
