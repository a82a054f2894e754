package ws

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
