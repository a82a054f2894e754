package main

import (
	"fmt"
	"io"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
	"github.com/tether-agent/tether/wire/vtquery"
)

// readLoop shows the PTY's output on stdout and returns why the
// connection ended (a *client.CloseError for a close frame). A snapshot
// (and a reset replay on a reattach) is written to a cleared terminal,
// after the line announcing the attachment, so that the snapshot leaves
// the screen and cursor exactly as they are in the PTY (the line
// scrolls into the local scrollback); replayed bytes, snapshot or raw,
// go through the query filter; a resume is announced at the end of its
// replay; live bytes go through as they are. It signals activity after
// each write.
func (a *attachClient) readLoop(p *client.PTY, reattach bool, activity chan<- struct{}) error {
	r := p.Replay()
	w := termWriter{w: a.stdout, alt: &a.alt}
	announced := false
	if r.Snapshot || (r.Reset && reattach) {
		// What is shown no longer continues; a snapshot draws a fresh
		// terminal. Held bytes belonged to the old screen.
		a.filter = nil
		if a.term {
			// Only a terminal is reset: to a file or a pipe tether
			// writes nothing of its own.
			w.write([]byte(clearScreen))
			if reattach {
				w.write([]byte(clearScrollback))
			}
		}
		if w.err == nil {
			a.announce(r, true)
			announced = true
		}
	}
	if a.filter == nil {
		a.filter = vtquery.New()
	}
	snapLeft := r.SnapshotBytes
	a.snapshotCut = snapLeft > 0
	replaying := true
	endReplay := func() {
		replaying = false
		if held := a.filter.Flush(nil); len(held) > 0 {
			w.write(held)
		}
		if w.err == nil && !announced {
			a.announce(r, false)
		}
	}
	if snapLeft == 0 && p.Offset() >= r.ReplayEndOffset {
		endReplay()
	}
	buf := make([]byte, 32<<10)
	var filtered []byte
	for w.err == nil {
		before := p.Offset()
		n, err := p.Read(buf)
		if n > 0 {
			live := buf[:n]
			if replaying {
				var replayed []byte
				if snapLeft > 0 {
					// A Read never returns snapshot and live bytes together.
					replayed, live = live, nil
					snapLeft -= int64(n)
					a.snapshotCut = snapLeft > 0
				} else {
					k := min(int64(n), max(r.ReplayEndOffset-before, 0))
					replayed, live = live[:k], live[k:]
				}
				filtered = a.filter.Append(filtered[:0], replayed)
				if len(filtered) > 0 {
					w.write(filtered)
				}
				if snapLeft == 0 && p.Offset() >= r.ReplayEndOffset {
					endReplay()
				}
			}
			if len(live) > 0 {
				w.write(live)
			}
			select {
			case activity <- struct{}{}:
			default:
			}
		}
		if err != nil && w.err == nil {
			return err
		}
	}
	return fmt.Errorf("%w: %v", errStdout, w.err)
}

// termWriter writes to the terminal, follows its alternate screen and
// keeps the first error.
type termWriter struct {
	w   io.Writer
	alt *altScreen
	err error
}

func (t *termWriter) write(b []byte) {
	if t.err == nil {
		t.alt.write(b)
		_, t.err = t.w.Write(b)
	}
}

// announce says on stderr that the attachment is made, before a
// snapshot or once a resumed replay is shown: the first time with the way out (and a fresh token), after
// that "reconnected", and how.
func (a *attachClient) announce(r wire.Replay, lineStart bool) {
	var lines []string
	switch {
	case !a.announced:
		a.announced = true
		if a.fresh {
			lines = append(lines, "tether: attach token "+a.attach)
		}
		if a.view {
			lines = append(lines, "tether: attached read-only (--view): nothing you type is sent; Enter ~. to detach")
		} else {
			lines = append(lines, "tether: attached; Enter ~. to detach")
		}
	case r.Reason == wire.ReasonEpochMismatch:
		lines = append(lines, "tether: reconnected, to a new terminal: the previous one ended while away")
	case r.Reason == wire.ReasonOffsetRolledOut:
		lines = append(lines, "tether: reconnected; more was printed while away than the host keeps: the screen is redrawn")
	case r.Reset:
		lines = append(lines, "tether: reconnected; the screen is redrawn ("+r.Reason+")")
	default:
		lines = append(lines, "tether: reconnected")
	}
	a.sayLines(lineStart, lines...)
}
