package spender_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// TestNewRejectsInvalidOptions: an invalid option is an error at
// construction that names it, not a slow failure on every Reserve.
func TestNewRejectsInvalidOptions(t *testing.T) {
	src := newAllocator(t, fakeclock.New())
	tune := func(f func(*spender.LeaseTuning)) spender.Option {
		lt := spender.DefaultLeaseTuning()
		f(&lt)
		return spender.WithLeaseTuning(lt)
	}
	for _, tc := range []struct {
		name string
		opts []spender.Option
		want string
	}{
		{"spender id over 128 bytes", []spender.Option{spender.WithLeases(src), spender.WithSpenderID(strings.Repeat("s", 129))}, "WithSpenderID"},
		{"spender id not UTF-8", []spender.Option{spender.WithLeases(src), spender.WithSpenderID("gw-\xff")}, "WithSpenderID"},
		{"nil source", []spender.Option{spender.WithLeases(nil)}, "WithLeases"},
		{"no shards", []spender.Option{spender.WithShards(0)}, "WithShards"},
		{"negative sweep", []spender.Option{spender.WithSweepInterval(-time.Second)}, "WithSweepInterval"},
		{"unknown policy", []spender.Option{spender.WithLeases(src), spender.WithFallback(9)}, "WithFallback"},
		{"zero deadline", []spender.Option{spender.WithLeases(src), tune(func(lt *spender.LeaseTuning) { lt.SlowPathDeadline = 0 })}, "SlowPathDeadline"},
		{"window past the deadline", []spender.Option{spender.WithLeases(src), tune(func(lt *spender.LeaseTuning) { lt.BatchWindow = time.Second })}, "BatchWindow"},
		{"negative horizon", []spender.Option{spender.WithLeases(src), tune(func(lt *spender.LeaseTuning) { lt.Horizon = -1 })}, "Horizon"},
		{"zero maintenance", []spender.Option{spender.WithLeases(src), tune(func(lt *spender.LeaseTuning) { lt.MaintenanceInterval = 0 })}, "MaintenanceInterval"},
		{"zero call timeout", []spender.Option{spender.WithLeases(src), tune(func(lt *spender.LeaseTuning) { lt.CallTimeout = 0 })}, "CallTimeout"},
		// Options of a leased Limiter, given to a standalone one, even at
		// their defaults.
		{"spender id, standalone", []spender.Option{spender.WithSpenderID("gw-1")}, "WithSpenderID"},
		{"epoch, standalone", []spender.Option{spender.WithEpoch(0)}, "WithEpoch"},
		{"lease tuning, standalone", []spender.Option{spender.WithLeaseTuning(spender.DefaultLeaseTuning())}, "WithLeaseTuning"},
		{"fallback, standalone", []spender.Option{spender.WithFallback(spender.FailClosed)}, "WithFallback"},
		{"logger, standalone", []spender.Option{spender.WithShards(4), spender.WithLogger(nil)}, "WithLogger"},
		{"metrics, standalone", []spender.Option{spender.WithMetrics(nil)}, "WithMetrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := spender.New(fakeclock.New(), tc.opts...)
			if err == nil {
				l.Close(ctx)
				t.Fatal("New accepted an invalid option")
			}
			if !errors.Is(err, spender.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want ErrInvalidOption naming %s", err, tc.want)
			}
		})
	}
	if err := spender.DefaultLeaseTuning().Validate(); err != nil {
		t.Fatalf("the defaults are invalid: %v", err)
	}
}
