package lease

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// TestDemandEstimateTimeConstant: the demand estimate of a gateway that
// sees about a request a second averages over a few requests (a time
// constant of three requests' worth), so its root-mean-square error is
// about 37% of the rate; at a fixed one-second constant it was 70%
// (1/sqrt(2)), and the share and the fallback rate took that noise as it
// was. The constant follows the estimate, which costs a bias (the estimate
// is slower to rise from a low value than to fall back to it): 12% low at
// 1/s, within 15%. A busy gateway's estimate still follows a step within
// about a second.
func TestDemandEstimateTimeConstant(t *testing.T) {
	const tick = 250 * time.Millisecond // the maintenance interval
	t.Run("quiet", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		var ss shareState
		var spent ration.Amount
		var sum, sumSq float64
		var n int
		arrival := rng.ExpFloat64()    // seconds; a Poisson stream at 1/s
		for i := 1; i <= 4*3600; i++ { // an hour of ticks
			now := float64(i) * tick.Seconds()
			for ; arrival < now; arrival += rng.ExpFloat64() {
				spent.Requests++
			}
			ss.trackDemand(spent, ration.Amount{}, bucket.Instant(i)*bucket.Instant(tick/time.Microsecond))
			if i > 4*30 { // past a warm-up of 30 s
				sum += ss.demReq
				sumSq += (ss.demReq - 1) * (ss.demReq - 1)
				n++
			}
		}
		mean, rms := sum/float64(n), math.Sqrt(sumSq/float64(n))
		if math.Abs(mean-1) > 0.15 {
			t.Errorf("mean estimate %.3f/s for a stream at 1/s, want within 15%%", mean)
		}
		if rms > 0.45 {
			t.Errorf("estimate's root-mean-square error %.0f%% of the rate at 1/s, want about 37%%, at most 45%% (70%% at a one-second constant)", 100*rms)
		}
		t.Logf("at 1/s: mean %.3f/s, root-mean-square error %.0f%%", mean, 100*rms)
	})
	t.Run("busy follows a step", func(t *testing.T) {
		var ss shareState
		var spent ration.Amount
		at := func(i int) bucket.Instant { return bucket.Instant(i) * bucket.Instant(tick/time.Microsecond) }
		i := 0
		for ; i < 4*30; i++ { // 30 s at 10/s
			spent.Requests += 10 / 4
			if i%2 == 0 {
				spent.Requests++ // 2.5 a tick
			}
			ss.trackDemand(spent, ration.Amount{}, at(i))
		}
		if ss.tau(ration.Amount{}) != demandTau {
			t.Fatalf("time constant %v at %.1f/s, want %v", ss.tau(ration.Amount{}), ss.demReq, demandTau)
		}
		for range 4 { // one second at 100/s
			i++
			spent.Requests += 25
			ss.trackDemand(spent, ration.Amount{}, at(i))
		}
		if ss.demReq < 60 {
			t.Errorf("estimate %.1f/s a second after a step from 10/s to 100/s, want at least 60 (1 - 1/e of the step)", ss.demReq)
		}
	})
}
