package engine

import (
	"testing"
	"time"
)

// TestWindowMatchesBruteForce checks the one-pass window against every
// window of a small admission sequence.
func TestWindowMatchesBruteForce(t *testing.T) {
	type ev struct{ t, d int64 }
	evs := []ev{{0, 5}, {10, 3}, {10, -2}, {500_000, 7}, {1_000_000, 1}, {1_000_001, 4}, {3_000_000, -1}, {3_000_000, 6}}
	const rate = 60 // one a second
	w := newWindow(rate, time.Minute)
	for _, e := range evs {
		w.add(e.t, e.d)
	}
	best := 0.0
	for i := range evs {
		sum := int64(0)
		for j := i; j < len(evs); j++ {
			sum += evs[j].d
			if i > 0 && evs[i-1].t == evs[i].t {
				continue // a window starting at t includes every event at t
			}
			v := float64(sum) - float64(rate)*float64(evs[j].t-evs[i].t)/perMinuteUs
			best = max(best, v)
		}
	}
	if got := w.maxExcess(); got != best {
		t.Fatalf("maxExcess = %v, brute force %v", got, best)
	}
}
