package prompt

import (
	"errors"
	"strings"
	"testing"

	"github.com/coder/acp-go-sdk"
)

// TestPromptOver16MiBRefused: Check, which both gateways use,
// refuses blocks over 16 MiB with ErrTooBig and takes 16 MiB.
func TestPromptOver16MiBRefused(t *testing.T) {
	// The JSON of one text block is its text and 26 bytes.
	fits := []acp.ContentBlock{acp.TextBlock(strings.Repeat("a", MaxBytes-len(`[{"text":"","type":"text"}]`)))}
	if _, _, err := Check(fits, acp.PromptCapabilities{}); err != nil {
		t.Errorf("a prompt of exactly 16 MiB: %v, want nil", err)
	}
	over := []acp.ContentBlock{acp.TextBlock(strings.Repeat("a", MaxBytes))}
	if _, _, err := Check(over, acp.PromptCapabilities{}); !errors.Is(err, ErrTooBig) {
		t.Errorf("a prompt over 16 MiB: %v, want ErrTooBig", err)
	}
}

// TestCheckTakesWhatTheAgentTakes: text and resource links always; image,
// audio and embedded resources only where advertised; a single plain
// text block needs no stored content.
func TestCheckTakesWhatTheAgentTakes(t *testing.T) {
	image := acp.ImageBlock("AA==", "image/png")
	audio := acp.ContentBlock{Audio: &acp.ContentBlockAudio{Type: "audio", Data: "AA==", MimeType: "audio/wav"}}
	res := acp.ResourceBlock(acp.EmbeddedResourceResource{TextResourceContents: &acp.TextResourceContents{Uri: "file:///a", Text: "x"}})
	link := acp.ResourceLinkBlock("a", "file:///a")
	all := acp.PromptCapabilities{Image: true, Audio: true, EmbeddedContext: true}
	for _, tc := range []struct {
		name   string
		blocks []acp.ContentBlock
		caps   acp.PromptCapabilities
		ok     bool
	}{
		{"text", []acp.ContentBlock{acp.TextBlock("a")}, acp.PromptCapabilities{}, true},
		{"link", []acp.ContentBlock{acp.TextBlock("a"), link}, acp.PromptCapabilities{}, true},
		{"image without", []acp.ContentBlock{acp.TextBlock("a"), image}, acp.PromptCapabilities{Audio: true, EmbeddedContext: true}, false},
		{"audio without", []acp.ContentBlock{audio}, acp.PromptCapabilities{Image: true, EmbeddedContext: true}, false},
		{"resource without", []acp.ContentBlock{res}, acp.PromptCapabilities{Image: true, Audio: true}, false},
		{"all with", []acp.ContentBlock{acp.TextBlock("a"), image, audio, res, link, acp.TextBlock("b")}, all, true},
		{"none", nil, all, false},
		{"unknown type", []acp.ContentBlock{{Text: &acp.ContentBlockText{Type: "video"}}}, all, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text, content, err := Check(tc.blocks, tc.caps)
			if (err == nil) != tc.ok {
				t.Fatalf("Check: %v, want ok %v", err, tc.ok)
			}
			if !tc.ok {
				return
			}
			if tc.name == "all with" && (text != "ab" || len(content) == 0) {
				t.Errorf("Check = %q, %s; want the text blocks' text and the blocks", text, content)
			}
			if tc.name == "text" && content != nil {
				t.Errorf("a plain text prompt has content %s, want none", content)
			}
		})
	}
}
