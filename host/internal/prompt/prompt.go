// Package prompt checks a prompt's ACP content blocks against what the
// configured agent accepts, for both gateways (docs/PROTOCOL.md, "Prompts
// carry the whole content"): text and resource_link blocks always, image,
// audio and embedded resource blocks where the agent advertised them, at
// most MaxBytes in all. An accepted prompt is its text (the text of its
// text blocks, for agents that take text only) and its blocks as JSON,
// stored and passed on as they are.
package prompt

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/coder/acp-go-sdk"
)

// MaxBytes bounds a prompt's content blocks, as JSON.
const MaxBytes = 16 << 20

// Errors of Check. Test for them with errors.Is.
var (
	// ErrNotAccepted: a block of a type the agent does not accept.
	ErrNotAccepted = errors.New("content block not accepted")
	// ErrTooBig: the blocks are over MaxBytes.
	ErrTooBig = errors.New("prompt too big")
	// ErrEmpty: no block at all.
	ErrEmpty = errors.New("prompt has no content block")
)

// Caps are the prompt capabilities of the configured agent; nil means
// text and resource links only (the echo and exec agents).
type Caps func() acp.PromptCapabilities

// Get returns c's capabilities (none beyond text for a nil c).
func (c Caps) Get() acp.PromptCapabilities {
	if c == nil {
		return acp.PromptCapabilities{}
	}
	return c()
}

// Check accepts blocks when the agent with caps takes every one of them
// and they are at most MaxBytes as JSON. It returns the text of the text
// blocks, joined as they come, and the blocks as JSON; content is nil for
// a prompt of one plain text block (its text says it all).
func Check(blocks []acp.ContentBlock, caps acp.PromptCapabilities) (text string, content json.RawMessage, err error) {
	if len(blocks) == 0 {
		return "", nil, ErrEmpty
	}
	var b strings.Builder
	for i, blk := range blocks {
		// The SDK decodes a block of a type it does not know as a text
		// block of that type: the type is checked, not only the variant.
		kind, ok := "", false
		switch {
		case blk.Text != nil:
			kind, ok = blk.Text.Type, blk.Text.Type == "text"
			if ok {
				b.WriteString(blk.Text.Text)
			}
		case blk.ResourceLink != nil:
			kind, ok = blk.ResourceLink.Type, blk.ResourceLink.Type == "resource_link"
		case blk.Image != nil:
			kind, ok = blk.Image.Type, caps.Image && blk.Image.Type == "image"
		case blk.Audio != nil:
			kind, ok = blk.Audio.Type, caps.Audio && blk.Audio.Type == "audio"
		case blk.Resource != nil:
			kind, ok = blk.Resource.Type, caps.EmbeddedContext && blk.Resource.Type == "resource"
		}
		if !ok {
			return "", nil, fmt.Errorf("block %d: the agent does not take %q blocks: %w", i, kind, ErrNotAccepted)
		}
	}
	raw, err := json.Marshal(blocks)
	if err != nil {
		return "", nil, fmt.Errorf("encode the prompt: %w", err)
	}
	if len(raw) > MaxBytes {
		return "", nil, fmt.Errorf("%d bytes of content blocks, at most %d: %w", len(raw), MaxBytes, ErrTooBig)
	}
	if len(blocks) == 1 && blocks[0].Text != nil && blocks[0].Text.Annotations == nil && len(blocks[0].Text.Meta) == 0 {
		return b.String(), nil, nil
	}
	return b.String(), raw, nil
}

// Blocks decodes stored content (a JSON array of ACP content blocks).
func Blocks(content json.RawMessage) ([]acp.ContentBlock, error) {
	var out []acp.ContentBlock
	if err := json.Unmarshal(content, &out); err != nil {
		return nil, fmt.Errorf("content blocks: %w", err)
	}
	return out, nil
}
