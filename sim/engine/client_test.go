package engine

import (
	"testing"
	"time"

	"github.com/rationhq/ration"
)

// shortDay is the client-day scenario on a window of an hour (five
// requests an hour, waits of 12 minutes) over three hours: the same shape
// as its 49 hours of a per-day key, at a sixteenth of the cost.
func shortDay(t *testing.T) Config {
	return Config{Scenario: scenario(t, "client-day"), Limits: ration.Limits{RPM: 5, Window: time.Hour}, Duration: 3 * time.Hour}
}

// TestClientContractOfTheIdeal: a fleet that is the ideal single bucket
// (sticky routing gives one key's whole budget to one owner; static split
// on one instance is one bucket) tells every refused client the ideal's
// exact wait, so the oracle finds no error, and a client alone that comes
// back ⌈Retry-After⌉ later is always admitted; beside other traffic at 2×
// another request takes the budget first now and then. Nothing is held
// by idle gateways (there is no allocator). The per-day window is
// simulated on its own time scale: the client admits what the limit
// allows, C + rho*t, to within a request.
func TestClientContractOfTheIdeal(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		min  float64 // the retries admitted, at least
	}{
		{"client/static/1", Config{Scenario: scenario(t, "client"), Strategy: Static, Instances: 1}, 1},
		{"client/sticky/8", Config{Scenario: scenario(t, "client"), Strategy: Sticky}, 1},
		{"client-load/sticky/8", Config{Scenario: scenario(t, "client-load"), Strategy: Sticky}, 0.9},
		{"client-day/sticky/8", func() Config { c := shortDay(t); c.Strategy = Sticky; return c }(), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.Seed = 3
			r := mustRun(t, tc.cfg)
			share, ok := r.RetriedAdmitted()
			if !ok || share < tc.min {
				t.Errorf("%d of %d honoured retries admitted, want at least %.0f%%", r.RetriesAdmitted, r.Retries, 100*tc.min)
			}
			if r.Refusals < r.Retries || r.RetryErrP50 != 0 || r.RetryErrP99 != 0 || r.RetryLate != 0 || r.RetryEarly != 0 {
				t.Errorf("%d refusals: Retry-After minus the ideal's wait %v at p50, %v at p99, %.3f late, %.3f early; want all 0",
					r.Refusals, r.RetryErrP50, r.RetryErrP99, r.RetryLate, r.RetryEarly)
			}
			if r.IdleChecks == 0 || r.IdleHolding != 0 {
				t.Errorf("%d of %d idle checks found budget held, want none of some", r.IdleHolding, r.IdleChecks)
			}
			if r.OverLimit > 0 || r.AdmittedUnits < r.Allowed-1 && tc.min == 1 {
				t.Errorf("admitted %.0f of the %.1f the limit allows (worst window %+.1f%% of C)", r.AdmittedUnits, r.Allowed, 100*r.OverLimit)
			}
			t.Logf("%d of %d retries admitted, %d refusals, %d idle checks; admitted %.0f of %.1f allowed", r.RetriesAdmitted, r.Retries, r.Refusals, r.IdleChecks, r.AdmittedUnits, r.Allowed)
		})
	}
}

// TestClientContractCatchesAWrongRetryAfter: a gateway that names half
// the wait sends its client back early, where the ideal refuses it again:
// every refusal is early, the median error negative, and fewer than 95%
// of the retries are admitted. One that names twice the wait plus 5 s
// is late on every refusal, with a positive median, though its client is
// admitted when it comes back.
func TestClientContractCatchesAWrongRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		wrong func(time.Duration) time.Duration
		early bool
	}{
		{"half", func(d time.Duration) time.Duration { return d / 2 }, true},
		{"twice plus 5 s", func(d time.Duration) time.Duration { return 2*d + 5*time.Second }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := mustRun(t, Config{Scenario: scenario(t, "client"), Strategy: Sticky, Seed: 3, retryAfter: tc.wrong})
			share, _ := r.RetriedAdmitted()
			t.Logf("%d refusals: %.3f early, %.3f late, error %v at p50; %d of %d retries admitted", r.Refusals, r.RetryEarly, r.RetryLate, r.RetryErrP50, r.RetriesAdmitted, r.Retries)
			if tc.early {
				if r.RetryEarly < 0.99 || r.RetryErrP50 >= 0 || share >= 0.95 {
					t.Errorf("a Retry-After of half the wait was not caught as early")
				}
				return
			}
			if r.RetryLate != 1 || r.RetryErrP50 <= 5*time.Second || share != 1 {
				t.Errorf("a Retry-After of twice the wait plus 5 s was not caught as late")
			}
		})
	}
}

// TestIdleHoldingIsReported: central, with a round trip (80 ms) longer
// than its deadline (50 ms), fails every request closed while the
// allocator grants each one anyway (on a key large enough that the
// grants left behind do not empty it); the grant made for a gateway's
// last request still counts a TTL later, and the oracle reports it. With
// a 2 ms round trip central gives every grant back at settlement, and the
// oracle reports nothing held.
func TestIdleHoldingIsReported(t *testing.T) {
	for _, tc := range []struct {
		latency time.Duration
		held    bool
	}{{40 * time.Millisecond, true}, {time.Millisecond, false}} {
		t.Run(tc.latency.String(), func(t *testing.T) {
			t.Parallel()
			r := mustRun(t, Config{Scenario: scenario(t, "client"), Strategy: Central, Instances: 2, Seed: 3,
				Limits: ration.Limits{RPM: 600}, Duration: 10 * time.Minute, Net: Net{Latency: tc.latency}})
			t.Logf("%d of %d idle checks held budget, up to %.0f; %d admitted", r.IdleHolding, r.IdleChecks, r.IdleHeld, r.Admitted)
			if r.IdleChecks == 0 || (r.IdleHolding > 0) != tc.held || (r.IdleHeld > 0) != tc.held || r.IdleKeys != 0 {
				t.Errorf("%d of %d idle checks held budget (%d with spender keys), up to %.0f units; want held: %v",
					r.IdleHolding, r.IdleChecks, r.IdleKeys, r.IdleHeld, tc.held)
			}
		})
	}
}
