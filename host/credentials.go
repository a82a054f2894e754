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
// credentialUpkeep until the returned stop is called; stop then stores
// them once more within its ctx and waits for the upkeep to end.
func keepCredentials(book *access.Book, log zerolog.Logger) (stop func(context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(credentialUpkeep)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
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
	return func(sctx context.Context) {
		cancel()
		<-done
		if err := book.FlushUsed(sctx); err != nil {
			log.Debug().Err(err).Msg("credentials' last use not stored at stop")
		}
	}
}
