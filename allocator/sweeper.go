package allocator

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/rationhq/ration/allocator/cluster"
)

// SweepEvery sweeps everything every interval until ctx ends, one of
// Sweep's parts at a time, evenly spread over the interval (so that what
// goes idle together, such as a credential's quota of keys, is dropped, and
// its quota freed, a part at a time), logging failures to log (nil
// discards) and what was dropped at debug level. On a cluster member that
// is not the leader the sweep is refused, quietly: a sweep is a command
// like any other, applied through the leader. It blocks; run it in its own
// goroutine and cancel ctx before Close. An interval of 0 or less means
// the lease TTL.
func (l *Ledger) SweepEvery(ctx context.Context, every time.Duration, log *slog.Logger) {
	if every <= 0 {
		every = l.TTL()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(max(every/sweepParts, time.Millisecond))
	defer t.Stop()
	for part := uint32(0); ; part = (part + 1) % sweepParts {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			k, s, err := l.sweepPart(ctx, part)
			switch {
			case errors.Is(err, cluster.ErrNotLeader) && !errors.Is(err, cluster.ErrOutcomeUnknown):
				// A cluster member that is not the leader: the leader sweeps.
			case err != nil && ctx.Err() == nil:
				log.Warn("allocator: sweep", "err", err)
			case k+s > 0:
				log.Debug("allocator: swept", "keys", k, "sessions", s)
			}
		}
	}
}
