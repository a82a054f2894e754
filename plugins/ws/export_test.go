package ws

import (
	"errors"
	"time"
)

// ConnClosing reports whether connection id has started closing (or is
// gone). Tests use it to stop producing once a limit has tripped.
func (s *Server) ConnClosing(id uint64) bool {
	s.mu.Lock()
	c := s.conns[id]
	s.mu.Unlock()
	if c == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing || c.done
}

// SetConnWriteBuffer sets the kernel send buffer of connection id, so that
// tests can fill its socket with little data.
func (s *Server) SetConnWriteBuffer(id uint64, n int) error {
	s.mu.Lock()
	c := s.conns[id]
	s.mu.Unlock()
	if c == nil {
		return errors.New("no such connection")
	}
	wb, ok := c.nc.(interface{ SetWriteBuffer(int) error })
	if !ok {
		return errors.New("not a TCP connection")
	}
	return wb.SetWriteBuffer(n)
}

// SetCertCheckEvery sets, before Start, how often a TLS handshake looks
// for a renewed certificate (0: every handshake).
func (s *Server) SetCertCheckEvery(d time.Duration) { s.certCheckEvery = d }

// RawUpgrades counts the upgrades made on the raw connection, not
// through net/http.
func (s *Server) RawUpgrades() int64 { return s.rawUpgrades.Load() }
