package transportkit

// OnPark makes q's link call f whenever it waits with nothing to
// deliver: a test then knows the next PushFrame finds the link idle.
func OnPark(q *Queue, f func()) {
	q.mu.Lock()
	q.onPark = f
	q.mu.Unlock()
}
