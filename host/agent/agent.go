// Package agent is the host's side of the agents that answer prompts: the
// Agent and Factory interfaces a live session's runs go through (an
// embedding program may implement them), the display Message, and the
// built-in agents: Echo, which answers a prompt with its own words (for
// tests and demos), and Exec, which runs a command per prompt and streams
// its standard output. ParseCommandLine splits the command lines given on
// tether's command line into words.
package agent

import "errors"

// Errors returned by the agents. Test for them with errors.Is.
var (
	// ErrRunFailed: a run ended without answering (the command could not be
	// started or exited with a non-zero status).
	ErrRunFailed = errors.New("agent run failed")
	// ErrNoCommand: an Exec factory was given no command.
	ErrNoCommand = errors.New("no agent command")
	// ErrCommandNotFound: an Exec agent's command cannot be found in PATH
	// or is not an executable file.
	ErrCommandNotFound = errors.New("agent command not found")
	// ErrUnterminatedQuote: a command line ends inside a quoted string.
	ErrUnterminatedQuote = errors.New("unterminated quote")
	// ErrTrailingBackslash: a command line ends with an escaping backslash.
	ErrTrailingBackslash = errors.New("trailing backslash")
)
