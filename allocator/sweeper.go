package allocator

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// SweepEvery calls Sweep every interval until ctx ends, logging failures
// to log (nil discards) and what was dropped at debug level. On a cluster
// member that is not the leader the sweep is refused, quietly: a sweep is
// a command like any other, applied through the leader. It blocks;
// run it in its own goroutine and cancel ctx before Close. An interval of
// 0 or less means the lease TTL.
func (l *Ledger) SweepEvery(ctx context.Context, every time.Duration, log *slog.Logger) {
	if every <= 0 {
		every = l.TTL()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			k, s, err := l.Sweep(ctx)
			switch {
			case errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrOutcomeUnknown):
				// A cluster member that is not the leader: the leader sweeps.
			case err != nil && ctx.Err() == nil:
				log.Warn("allocator: sweep", "err", err)
			case k+s > 0:
				log.Debug("allocator: swept", "keys", k, "sessions", s)
			}
		}
	}
}
