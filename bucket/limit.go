package bucket

import (
	"fmt"
	"time"
)

// MaxScaled bounds every fixed-point quantity a Bucket stores: the capacity
// (Capacity*Scale), one period's refill and, negated, the deepest debt. It
// leaves headroom so that no intermediate sum overflows an int64.
const MaxScaled = 1 << 61

// InfDuration is the wait reported for a cost the bucket can never cover
// (a cost above its capacity), and the saturation value of every wait.
const InfDuration = time.Duration(1<<63 - 1)

// Limit describes a token bucket: it holds at most Capacity tokens and
// refills at Refill tokens per Period.
//
// All three fields must be positive; Period must be a whole number of
// microseconds. Capacity and Refill are independent: Capacity is how much
// clumping is forgiven after a quiet spell, Refill/Period the sustained
// rate. A Limit that would not fit the fixed-point scale (see [MaxScaled])
// is rejected by [Limit.Validate] with an error that names the field.
type Limit struct {
	Capacity int64         // tokens the bucket holds when full (the burst)
	Refill   int64         // tokens added per Period
	Period   time.Duration // refill period, a positive whole number of microseconds
}

// PerMinute returns the default bucket for a limit of n tokens per minute:
// capacity n, refilled n per minute (the contract's default).
func PerMinute(n int64) Limit {
	return Limit{Capacity: n, Refill: n, Period: time.Minute}
}

// scaleOf returns the fixed-point parameters of l: units per token and units
// added per microsecond. It assumes Refill and Period are positive.
func (l Limit) scaleOf() (scale, inc int64) {
	p := int64(l.Period / time.Microsecond)
	g := gcd(l.Refill, p)
	return p / g, l.Refill / g
}

// Validate reports whether l describes a bucket this package can hold
// exactly. The error wraps [ErrInvalidLimit] and names the offending field.
func (l Limit) Validate() error {
	switch {
	case l.Capacity <= 0:
		return fmt.Errorf("bucket: capacity %d: %w: must be positive", l.Capacity, ErrInvalidLimit)
	case l.Refill <= 0:
		return fmt.Errorf("bucket: refill %d: %w: must be positive", l.Refill, ErrInvalidLimit)
	case l.Period < time.Microsecond || l.Period%time.Microsecond != 0:
		return fmt.Errorf("bucket: period %v: %w: must be a positive whole number of microseconds", l.Period, ErrInvalidLimit)
	}
	scale, inc := l.scaleOf()
	if l.Capacity > MaxScaled/scale {
		return fmt.Errorf("bucket: capacity %d with refill %d per %v: %w: too large for exact arithmetic (at most %d)",
			l.Capacity, l.Refill, l.Period, ErrInvalidLimit, MaxScaled/scale)
	}
	if inc > MaxScaled/int64(l.Period/time.Microsecond) {
		return fmt.Errorf("bucket: refill %d per %v: %w: too large for exact arithmetic", l.Refill, l.Period, ErrInvalidLimit)
	}
	return nil
}

// Rate returns the refill rate in tokens per second, for display only: the
// bucket never computes with it.
func (l Limit) Rate() float64 {
	return float64(l.Refill) / l.Period.Seconds()
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
