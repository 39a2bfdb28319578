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
// another request takes the budget first now and then. No retry is sent
// early, and the ideal offered each retry admits exactly those the fleet
// admits. Nothing is held
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
			if r.RetriesEarly != 0 || r.RetriesIdeal != r.RetriesAdmitted {
				t.Errorf("%d retries sent early, the ideal admitted %d of them where the fleet admitted %d; want 0 early and the same", r.RetriesEarly, r.RetriesIdeal, r.RetriesAdmitted)
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
// every refusal is early, the median error negative, most retries are
// counted as sent early, and fewer than 95% of the retries are admitted. One that names twice the wait plus 5 s
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
			t.Logf("%d refusals: %.3f early, %.3f late, error %v at p50; %d of %d retries admitted, %d sent early", r.Refusals, r.RetryEarly, r.RetryLate, r.RetryErrP50, r.RetriesAdmitted, r.Retries, r.RetriesEarly)
			if tc.early {
				if r.RetryEarly < 0.99 || r.RetryErrP50 >= 0 || share >= 0.95 || r.RetriesEarly < r.Retries/2 {
					t.Errorf("a Retry-After of half the wait was not caught as early")
				}
				return
			}
			if r.RetryLate != 1 || r.RetryErrP50 <= 5*time.Second || share != 1 || r.RetriesEarly != 0 {
				t.Errorf("a Retry-After of twice the wait plus 5 s was not caught as late")
			}
		})
	}
}

// TestIdleHoldingIsReported: a leased gateway that never settles its
// requests (a holding kept on purpose) keeps what they reserved, and the
// idle checks find it in its spender (ration_spender_keys_held) and at the
// allocator (the holding its give-back call stated); one that settles them holds nothing a TTL after
// its last request ended. The same with the allocator unreachable for a
// fifth of the run: a check due while it is down waits until a TTL after
// it is back, and still catches the leak. Central with a 2 ms round trip
// gives every grant back at settlement, and nothing is reported held.
func TestIdleHoldingIsReported(t *testing.T) {
	light := func(t *testing.T) Scenario { return scenario(t, "client-load") }
	cut := func(t *testing.T) Scenario {
		sc := scenario(t, "client")
		sc.OutageFrom, sc.OutageTo = 0.4, 0.6
		return sc
	}
	for _, tc := range []struct {
		name string
		sc   func(*testing.T) Scenario
		st   Strategy
		lim  ration.Limits
		leak bool
	}{
		{"60rpm/leased/leak", light, Leased, ration.Limits{RPM: 60}, true},
		{"60rpm/leased", light, Leased, ration.Limits{RPM: 60}, false},
		{"outage/leased/leak", cut, Leased, ration.Limits{}, true},
		{"outage/leased", cut, Leased, ration.Limits{}, false},
		{"60rpm/central", light, Central, ration.Limits{RPM: 60}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := mustRun(t, Config{Scenario: tc.sc(t), Strategy: tc.st, Instances: 8, Seed: 3, Limits: tc.lim, Overload: 0.5,
				Duration: 10 * time.Minute, Net: Net{Latency: time.Millisecond}, leak: tc.leak})
			t.Logf("%d of %d idle checks held budget (%d with spender keys, %d with shares, up to %.0f units at the allocator); %d admitted, %d fallback",
				r.IdleHolding, r.IdleChecks, r.IdleKeys, r.IdleShares, r.IdleHeld, r.Admitted, r.Fallback)
			switch {
			case r.IdleChecks < 8:
				t.Errorf("%d idle checks, want one per gateway at least", r.IdleChecks)
			case tc.leak && (r.IdleKeys < 8 || r.IdleHeld == 0):
				t.Errorf("a gateway that never settles was found holding its key %d times of %d, and up to %.0f units at the allocator; want at least once per gateway, and some units",
					r.IdleKeys, r.IdleChecks, r.IdleHeld)
			case !tc.leak && r.IdleHolding != 0:
				t.Errorf("%d of %d idle checks found budget held, want none", r.IdleHolding, r.IdleChecks)
			}
		})
	}
}
