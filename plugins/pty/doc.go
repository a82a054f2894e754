// Package pty will hold the PTY keep-alive backend plugin (SPEC §6): a
// registry of PTYs keyed by attach token, a ring buffer with absolute
// offsets, drain, reaper and limits, served over go-plugin like the
// WebSocket transport.
//
// It is empty until the PTY issue lands: until then the host refuses
// /api/pty with close code 4404 (endpoint switched off).
package pty
