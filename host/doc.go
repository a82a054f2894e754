// Package host is tether's authoritative side: the session table with its
// compare-and-swap teardown funnel, the JSON-RPC gateway that speaks to
// clients through transport plugins, the access checks, the agent runs, the
// plugin processes it starts and links, and the persistence it drives.
//
// The host never imports a plugin: it talks to them through the contract
// package, over go-plugin subprocesses in the product.
package host
