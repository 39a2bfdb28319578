package engine

import "time"

// window tracks the largest net charge admitted in any window of time, for
// one dimension, in one pass.
//
// With N(t) the cumulative net charge (reserved cost at admission, minus
// refunds and plus overruns at settlement) and rho the refill rate, the
// worst window [a, b] maximises N(b) - N(a-) - rho*(b - a). Writing
// S(t) = N(t) - rho*t, that is max over a <= b of S(b) - S(a-), which a
// running minimum of S finds as the events go by. Everything is kept in
// units of 1/period of a token (rate per period times microseconds), so
// the arithmetic is exact as long as the net charge times the period in
// microseconds fits an int64 (below 10^8 units for a day's window).
type window struct {
	rate   int64 // refill per period
	period int64 // the limit's window in µs (perMinuteUs for a minute)
	n      int64 // cumulative net charge, units of the dimension
	minS   int64 // min of S before each event, scaled by period
	excess int64 // max S(b) - S(a-) so far, scaled by period
	last   int64 // time of the last event; a window holds every event at its start
	seen   bool  // an event was recorded
}

const perMinuteUs = 60_000_000

// newWindow returns a window for a refill of rate per period.
func newWindow(rate int64, period time.Duration) window {
	return window{rate: rate, period: int64(period / time.Microsecond)}
}

// add records a net charge of delta at virtual time t (µs); events must
// come in time order.
func (w *window) add(t, delta int64) {
	if delta == 0 {
		return
	}
	if !w.seen || t != w.last {
		w.minS = min(w.minS, w.n*w.period-w.rate*t)
		w.last, w.seen = t, true
	}
	w.n += delta
	w.excess = max(w.excess, w.n*w.period-w.rate*t-w.minS)
}

// maxExcess returns max over windows of (admitted - rho*t), in units.
func (w *window) maxExcess() float64 { return float64(w.excess) / float64(w.period) }
