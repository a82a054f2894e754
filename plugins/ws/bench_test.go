package ws_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
)

// BenchmarkIdleConn reports the memory (heap and goroutine stacks) that
// idle connections add to the process: an upper bound for the server's
// share, since the in-process clients and the recorded Opened events
// count too. "admitted" minus "pending" is what admission costs: the
// reader goroutine and its frame reader.
func BenchmarkIdleConn(b *testing.B) {
	for _, admitted := range []bool{false, true} {
		name := "pending"
		if admitted {
			name = "admitted"
		}
		b.Run(name, func(b *testing.B) {
			const n = 500
			s, addr := startServer(b, contract.StartRequest{PingInterval: time.Hour, PeerTimeout: 2 * time.Hour})
			r := link(b, s)
			for range b.N {
				before := memInUse()
				clients := make([]*client, n)
				for i := range clients {
					clients[i] = dial(b, addr, "/api/ws", nil)
					id := r.opened(b, clients[i]).Conn
					if admitted {
						exec(b, s, admit(id))
					}
				}
				after := memInUse()
				b.ReportMetric(float64(after-before)/n, "B/conn")
				for _, c := range clients {
					c.nc.Close()
				}
			}
		})
	}
}

func memInUse() int64 {
	for range 3 {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse + ms.StackInuse)
}
