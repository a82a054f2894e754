// Package deptest holds the test that enforces the import boundaries
// between tether's packages (host, plugins, contract, testing; see
// STYLE.md, "Layout and boundaries"). It has no non-test code.
package deptest
