package pty

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"hash"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// BenchmarkOutput streams the output of a child that writes
// TETHER_BENCH_MIB MiB (default 64) and exits, with the default ring, into
// a sink that hashes it, and checks every byte arrived before the exit
// marker.
func BenchmarkOutput(b *testing.B) {
	mib := 64
	if s := os.Getenv("TETHER_BENCH_MIB"); s != "" {
		mib, _ = strconv.Atoi(s)
	}
	data := make([]byte, mib<<20)
	rand.Read(data)
	for i, c := range data {
		if c == '\n' {
			data[i] = 'n'
		}
	}
	file := filepath.Join(b.TempDir(), "data")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		b.Fatal(err)
	}
	want := sha256.Sum256(data)
	data = nil

	be := New(zerolog.Nop())
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
		attach(b, be, contract.AttachRequest{Token: token("bench" + strconv.Itoa(i)), Viewer: viewer(1), Argv: []string{"cat", file}})
		end := <-done
		mu.Lock()
		if end != int64(mib<<20) || gaps != 0 || [sha256.Size]byte(h.Sum(nil)) != want {
			b.Errorf("got %d bytes with %d gaps, want the %d bytes of the file", end, gaps, mib<<20)
		}
		mu.Unlock()
	}
}
