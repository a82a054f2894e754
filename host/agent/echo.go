package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"
)

var _ Agent = (*Echo)(nil)

// Echo is an agent that answers a prompt with the prompt's own text, one
// delta per word, where a delta is the word with the whitespace that follows
// it. Concatenating the deltas gives back the prompt exactly; whitespace
// leading the prompt goes with the first delta, and a prompt of whitespace
// only is one delta. The history is ignored. The zero Echo streams without
// delay.
type Echo struct {
	// Delay is waited before each delta; 0 means none.
	Delay time.Duration
}

// NewEchoFactory returns a factory of Echo agents that wait delay before
// each delta (0 = none).
func NewEchoFactory(delay time.Duration) Factory {
	return FactoryFunc(func(ctx context.Context, sessionKey string, _ json.RawMessage) (Agent, error) {
		return &Echo{Delay: delay}, nil
	})
}

// Run emits the words of prompt. A cancelled ctx stops it at once, before
// the next delta, with an error wrapping ctx.Err(). An empty prompt emits
// nothing and returns nil.
func (e *Echo) Run(ctx context.Context, history []Message, prompt string, emit func(delta string)) error {
	for _, delta := range echoDeltas(prompt) {
		if err := e.wait(ctx); err != nil {
			return err
		}
		emit(delta)
	}
	return nil
}

// wait waits e.Delay, or until ctx is done.
func (e *Echo) wait(ctx context.Context) error {
	if e.Delay <= 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("echo interrupted: %w", err)
		}
		return nil
	}
	timer := time.NewTimer(e.Delay)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("echo interrupted: %w", ctx.Err())
	case <-timer.C:
		return nil
	}
}

// Close does nothing: an Echo holds no resources.
func (e *Echo) Close() error { return nil }

// echoDeltas splits s into words, each with the whitespace that follows it;
// leading whitespace goes with the first word. Bytes that are not valid
// UTF-8 count as word characters.
func echoDeltas(s string) []string {
	var out []string
	start, i := 0, skipSpace(s, 0, true)
	for i < len(s) {
		i = skipSpace(s, skipSpace(s, i, false), true)
		out = append(out, s[start:i])
		start = i
	}
	if start < len(s) { // whitespace only
		out = append(out, s[start:])
	}
	return out
}

// skipSpace returns the index of the first rune at or after i that is not
// whitespace (space true) or is whitespace (space false).
func skipSpace(s string, i int, space bool) int {
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if unicode.IsSpace(r) != space {
			break
		}
		i += n
	}
	return i
}
