package host

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/access"
)

// credentialUpkeep is how often the host stores when credentials were
// last used and drops expired page sign-ins.
const credentialUpkeep = time.Minute

// keepCredentials stores the book's last-used times and prunes it every
// credentialUpkeep until ctx is done, then stores them once more, and
// returns a function that waits for it to end.
func keepCredentials(ctx context.Context, book *access.Book, log zerolog.Logger) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(credentialUpkeep)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				fctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if err := book.FlushUsed(fctx); err != nil {
					log.Debug().Err(err).Msg("credentials' last use not stored at stop")
				}
				cancel()
				return
			case <-t.C:
			}
			uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := book.FlushUsed(uctx); err != nil {
				log.Warn().Err(err).Msg("storing when credentials were last used")
			}
			if err := book.Prune(uctx); err != nil {
				log.Warn().Err(err).Msg("pruning expired page sign-ins")
			}
			cancel()
		}
	}()
	return func() { <-done }
}
