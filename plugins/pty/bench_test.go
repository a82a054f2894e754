package pty

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// BenchmarkOutput streams the output of a child that writes
// TETHER_BENCH_MIB MiB (default 64) and exits, with the default ring, into
// a sink that hashes it, and checks every byte arrived before the exit
// marker: random bytes, and shell-like coloured lines; each with the
// screen model fed as output comes (model=on) and left unfed (model=off,
// the baseline the model must not slow by more than 10 %).
func BenchmarkOutput(b *testing.B) {
	mib := 64
	if s := os.Getenv("TETHER_BENCH_MIB"); s != "" {
		mib, _ = strconv.Atoi(s)
	}
	for _, kind := range []string{"random", "lines"} {
		data := make([]byte, mib<<20)
		if kind == "random" {
			rand.Read(data)
			for i, c := range data {
				if c == '\n' {
					data[i] = 'n'
				}
			}
		} else {
			copy(data, bytes.Repeat(shellOutput(), 1+len(data)/len(shellOutput())))
		}
		for _, model := range []string{"on", "off"} {
			b.Run(kind+"/model="+model, func(b *testing.B) { benchOutput(b, data, model == "off") })
		}
	}
}

func benchOutput(b *testing.B, data []byte, noFeed bool) {
	mib := len(data) >> 20
	file := filepath.Join(b.TempDir(), "data")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		b.Fatal(err)
	}
	want := sha256.Sum256(data)

	be := New(zerolog.Nop())
	be.testNoFeed = noFeed
	b.Cleanup(be.Shutdown)
	if _, err := be.Start(context.Background(), contract.BackendConfig{}); err != nil {
		b.Fatal(err)
	}
	var (
		mu     sync.Mutex
		h      hash.Hash
		n      int64
		gaps   int
		exited chan int64
	)
	up := make(chan struct{})
	be.testHookStream = func() { close(up) }
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- be.Output(ctx, func(_ context.Context, outs []contract.Output) error {
			mu.Lock()
			defer mu.Unlock()
			for _, o := range outs {
				if o.Offset != n {
					gaps++
				}
				if o.Exited {
					exited <- n
					continue
				}
				h.Write(o.Data)
				n = o.Offset + int64(len(o.Data))
			}
			return nil
		})
	}()
	b.Cleanup(func() { cancel(); <-errc })
	<-up

	b.SetBytes(int64(mib << 20))
	b.ResetTimer()
	for i := range b.N {
		mu.Lock()
		h, n, gaps, exited = sha256.New(), 0, 0, make(chan int64, 1)
		done := exited
		mu.Unlock()
		attach(b, be, contract.AttachRequest{Token: token("bench" + strconv.Itoa(i)), Viewer: viewer(1), Argv: sh("stty -opost; exec cat " + file)})
		end := <-done
		mu.Lock()
		if end != int64(mib<<20) || gaps != 0 || [sha256.Size]byte(h.Sum(nil)) != want {
			b.Errorf("got %d bytes with %d gaps, want the %d bytes of the file", end, gaps, mib<<20)
		}
		mu.Unlock()
	}
}

// shellOutput is about 1 MiB of what a shell session prints: directory
// listings and compiler errors in colour, prose, prompts.
func shellOutput() []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < 1<<20; i++ {
		switch i % 4 {
		case 0:
			fmt.Fprintf(&b, "\x1b[01;34mdir%d\x1b[0m  \x1b[01;32mexec%d\x1b[0m  file%d.go\r\n", i, i, i)
		case 1:
			fmt.Fprintf(&b, "main.go:%d:%d: \x1b[1;31merror:\x1b[0m undefined: x%d\r\n", i, i%80, i)
		case 2:
			fmt.Fprintf(&b, "%s\r\n", strings.Repeat("lorem ipsum ", 1+i%6))
		default:
			fmt.Fprintf(&b, "\x1b[32muser@host\x1b[0m:\x1b[34m~/src\x1b[0m$ ls -l %d\r\n", i)
		}
	}
	return b.Bytes()
}
