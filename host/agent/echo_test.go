package agent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"pgregory.net/rapid"
)

// runEcho runs an Echo with delay on prompt and returns its deltas and error.
func runEcho(ctx context.Context, delay time.Duration, prompt string) ([]string, error) {
	var deltas []string
	err := (&Echo{Delay: delay}).Run(ctx, nil, prompt, func(d string) { deltas = append(deltas, d) })
	return deltas, err
}

func TestEchoDeltas(t *testing.T) {
	tests := []struct {
		prompt string
		want   []string
	}{
		{"", nil},
		{"a", []string{"a"}},
		{"hello world", []string{"hello ", "world"}},
		{"hello world\n", []string{"hello ", "world\n"}},
		{"  lead", []string{"  lead"}},
		{"  lead  trail  ", []string{"  lead  ", "trail  "}},
		{"a \t\n b", []string{"a \t\n ", "b"}},
		{"   ", []string{"   "}},
		{"é ü\u00a0ß", []string{"é ", "ü\u00a0", "ß"}},
		{"\xff \xfe", []string{"\xff ", "\xfe"}},
	}
	for _, tt := range tests {
		t.Run(tt.prompt, func(t *testing.T) {
			got, err := runEcho(context.Background(), 0, tt.prompt)
			if err != nil {
				t.Fatalf("Run(%q): got error %v, want nil", tt.prompt, err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Run(%q): got deltas %q, want %q", tt.prompt, got, tt.want)
			}
		})
	}
}

// TestEchoConcatenation checks that the deltas give back the prompt and that
// there is one delta per word.
func TestEchoConcatenation(t *testing.T) {
	words := rapid.StringOf(rapid.SampledFrom([]rune{'a', 'b', 'é', ' ', '\t', '\n', '\u00a0', '\u2003'}))
	rapid.Check(t, func(rt *rapid.T) {
		prompt := rapid.OneOf(rapid.String(), words).Draw(rt, "prompt")
		deltas, err := runEcho(context.Background(), 0, prompt)
		if err != nil {
			rt.Fatalf("Run: got error %v, want nil", err)
		}
		if got := strings.Join(deltas, ""); got != prompt {
			rt.Fatalf("concatenated deltas: got %q, want %q", got, prompt)
		}
		want := len(strings.FieldsFunc(prompt, unicode.IsSpace))
		if want == 0 && prompt != "" {
			want = 1 // whitespace only
		}
		if len(deltas) != want {
			rt.Errorf("deltas of %q: got %d (%q), want %d", prompt, len(deltas), deltas, want)
		}
		for i, d := range deltas {
			if d == "" {
				rt.Errorf("delta %d: got empty, want non-empty", i)
			}
		}
	})
}

func TestEchoCancel(t *testing.T) {
	t.Run("between deltas", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var got []string
		err := (&Echo{}).Run(ctx, nil, "one two three four", func(d string) {
			got = append(got, d)
			if len(got) == 2 {
				cancel()
			}
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run: got error %v, want %v", err, context.Canceled)
		}
		if want := []string{"one ", "two "}; !slices.Equal(got, want) {
			t.Errorf("Run: got deltas %q, want %q", got, want)
		}
	})
	t.Run("during delay", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		result := make(chan error, 1)
		emitted := make(chan string, 10)
		go func() {
			result <- (&Echo{Delay: time.Hour}).Run(ctx, nil, "never said", func(d string) { emitted <- d })
		}()
		cancel()
		if err := <-result; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: got error %v, want %v", err, context.Canceled)
		}
		if n := len(emitted); n != 0 {
			t.Errorf("Run: got %d deltas, want 0", n)
		}
	})
}

func TestEchoDelay(t *testing.T) {
	const delay = 2 * time.Millisecond
	start := time.Now()
	got, err := runEcho(context.Background(), delay, "a b c")
	if err != nil {
		t.Fatalf("Run: got error %v, want nil", err)
	}
	if elapsed := time.Since(start); elapsed < 3*delay {
		t.Errorf("Run with delay %v: got %v for 3 deltas, want at least %v", delay, elapsed, 3*delay)
	}
	if want := []string{"a ", "b ", "c"}; !slices.Equal(got, want) {
		t.Errorf("Run: got deltas %q, want %q", got, want)
	}
}

func TestEchoFactory(t *testing.T) {
	a, err := NewEchoFactory(0).NewAgent(context.Background(), "20250102_030405_abcdef", nil)
	if err != nil {
		t.Fatalf("NewAgent: got error %v, want nil", err)
	}
	if _, ok := a.(*Echo); !ok {
		t.Errorf("NewAgent: got %T, want *Echo", a)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close: got error %v, want nil", err)
	}
}
