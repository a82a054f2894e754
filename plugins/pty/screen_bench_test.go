package pty

import (
	"fmt"
	"strings"
	"testing"
)

// fullScreen returns output that fills a cols×rows screen and lines of
// scrollback with coloured text in every column.
func fullScreen(cols, rows, lines int) []byte {
	var b strings.Builder
	for i := range lines + rows {
		for x := 0; x < cols; x += 10 {
			fmt.Fprintf(&b, "\x1b[3%d;4%dm%-10.10s", (i+x)%8, (i+x/10)%8, fmt.Sprintf("%d:%d", i, x))
		}
		b.WriteString("\x1b[m")
		if i < lines+rows-1 {
			b.WriteString("\r\n")
		}
	}
	return []byte(b.String())
}

// BenchmarkSnapshot builds the snapshot of a full screen of 80×24 and of
// 200×60 with 1,000 lines of scrollback: every cell coloured, a new colour
// every 10 columns (full), and shell output (shell), and reports its size.
func BenchmarkSnapshot(b *testing.B) {
	for _, tc := range []struct {
		name       string
		cols, rows int
		shell      bool
	}{{"full/80x24", 80, 24, false}, {"full/200x60", 200, 60, false}, {"shell/80x24", 80, 24, true}, {"shell/200x60", 200, 60, true}} {
		b.Run(tc.name, func(b *testing.B) {
			tm := newTerm(tc.cols, tc.rows, DefaultScrollback)
			if tc.shell {
				tm.write(shellOutput())
			} else {
				tm.write(fullScreen(tc.cols, tc.rows, DefaultScrollback))
			}
			var snap []byte
			for b.Loop() {
				snap = tm.snapshot(snap[:0])
			}
			b.ReportMetric(float64(len(snap)), "snapshot-bytes")
		})
	}
}

// BenchmarkFeed feeds the emulator shell-like output (coloured lines that
// scroll) and full-screen redraws (no scrolling), on 80×24 and 200×60
// with 1,000 lines of scrollback: the model's own speed, which bounds how
// much output it keeps up with.
func BenchmarkFeed(b *testing.B) {
	lines := shellOutput()
	var redraw strings.Builder
	for redraw.Len() < 1<<20 {
		for y := 1; y <= 24; y++ {
			fmt.Fprintf(&redraw, "\x1b[%d;1H\x1b[3%dm%s\x1b[m\x1b[K", y, y%8, strings.Repeat("abcdefgh", 9))
		}
	}
	for _, in := range []struct {
		name string
		data []byte
	}{{"lines", lines}, {"redraw", []byte(redraw.String())}} {
		for _, size := range [][2]int{{80, 24}, {200, 60}} {
			b.Run(fmt.Sprintf("%s/%dx%d", in.name, size[0], size[1]), func(b *testing.B) {
				tm := newTerm(size[0], size[1], DefaultScrollback)
				b.SetBytes(int64(len(in.data)))
				for b.Loop() {
					tm.write(in.data)
				}
			})
		}
	}
}
