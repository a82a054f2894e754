package owners

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
	"github.com/tether-agent/tether/host/internal/ownership"
)

// binds is how many revision-checked updates a session's life makes in
// the benchmark between its create and its delete: two viewers bound and
// both gone again.
const binds = 4

// casPerLife is the compare-and-swap operations of one life.
const casPerLife = binds + 2

var benchKeys atomic.Int64

// life runs one session's life on s: the claim (create), binds and
// teardowns (updates, each at the revision the last one returned) and
// the release (delete).
func life(s ownership.Store) error {
	ctx := context.Background()
	key := fmt.Sprintf("20250105_000000_%06x", benchKeys.Add(1))
	o := ownership.Owner{Host: "h", SessionID: key[16:], Gen: 1}
	rev, err := s.Create(ctx, key, o)
	if err != nil {
		return err
	}
	for i := range binds {
		o.Gen++
		if i < binds/2 {
			o.Viewers = append(o.Viewers, contract.TransportID{Instance: "ws", Conn: uint64(i + 1)})
		} else {
			o.Viewers = o.Viewers[1:]
		}
		if rev, err = s.Update(ctx, key, o, rev); err != nil {
			return err
		}
	}
	return s.Delete(ctx, key, rev)
}

// BenchmarkOwnersCAS measures the ownership store at the session table's
// access pattern, a life of create, updates and delete per session:
// "serial" is one session at a time (the latency of a bind), "parallel"
// many sessions at once over every connection (the throughput). The
// metric is compare-and-swap operations per second; mem is the single
// host's in-memory store, for scale.
func BenchmarkOwnersCAS(b *testing.B) {
	setups := []struct {
		name   string
		stores func(b *testing.B) []ownership.Store
	}{
		{"mem", func(*testing.B) []ownership.Store { return []ownership.Store{ownership.NewMem()} }},
		{"single", func(b *testing.B) []ownership.Store {
			srv := clustertest.StartServer(b)
			var stores []ownership.Store
			for range 3 {
				_, js := clustertest.Connect(b, srv.ClientURL())
				stores = append(stores, openOwners(b, js, KVConfig{}))
			}
			return stores
		}},
		{"3-node", func(b *testing.B) []ownership.Store {
			var stores []ownership.Store
			for _, k := range clusterOwners(b, clustertest.StartCluster(b, 3)) {
				stores = append(stores, k)
			}
			return stores
		}},
	}
	for _, setup := range setups {
		b.Run(setup.name, func(b *testing.B) {
			stores := setup.stores(b)
			b.Run("serial", func(b *testing.B) {
				for b.Loop() {
					if err := life(stores[0]); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*casPerLife)/b.Elapsed().Seconds(), "cas/s")
			})
			b.Run("parallel", func(b *testing.B) {
				var next atomic.Int64
				b.SetParallelism(16)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					s := stores[int(next.Add(1))%len(stores)]
					for pb.Next() {
						if err := life(s); err != nil {
							b.Error(err) // not Fatal: this is not the benchmark's goroutine
							return
						}
					}
				})
				b.ReportMetric(float64(b.N*casPerLife)/b.Elapsed().Seconds(), "cas/s")
			})
		})
	}
}
