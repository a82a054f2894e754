// Package termfidelity holds the screen-snapshot fidelity test: real
// output runs through the PTY backend, and both the full raw stream and
// the backend's snapshot are rendered in @xterm/headless — the terminal
// emulator of tether's page, which no one here wrote — and compared cell
// by cell: characters, widths, colours and attributes, the scrollback, the
// alternate screen, the cursor, the title and the input modes.
//
// It needs node and the npm packages of this directory (npm ci); without
// them the test fails, it does not skip.
package termfidelity
