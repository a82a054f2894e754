// Package deptest holds the test that enforces the import boundaries
// between tether's packages (host, plugins, contract, wire, client,
// testing; the README's Architecture section lists them). It has no
// non-test code.
package deptest
