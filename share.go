package ration

import (
	"math/bits"
	"time"
)

// ShareUnit is a whole refill rate in a Share's unit: a share is counted in
// millionths of a key's refill rate.
const ShareUnit = 1_000_000

// Share is a fraction of a key's refill rate, per dimension, in millionths
// (0 to ShareUnit): the rate at which an allocator lets one spender refill
// its own lease. Requests = 250000 on a key of 6000 requests per minute is
// 1500 requests per minute. 0 = no share in that dimension.
type Share struct {
	Requests uint32
	Tokens   uint32
}

// Zero reports whether s shares nothing.
func (s Share) Zero() bool { return s == Share{} }

// Accrued returns what share s of l's refill rate adds over d: whole units
// per dimension, rounded up when up is true (the allocator's count of what a
// spender may have added, an upper bound) and down otherwise (what a spender
// adds, a lower bound). An unlimited dimension, a zero share or d <= 0
// accrues 0. The result saturates at MaxAmount.
func (l Limits) Accrued(s Share, d time.Duration, up bool) Amount {
	if d <= 0 {
		return Amount{}
	}
	p := l.Period()
	return Amount{Requests: accrued(l.RPM, s.Requests, d, p, up), Tokens: accrued(l.TPM, s.Tokens, d, p, up)}
}

// accrued is rate × ppm/ShareUnit × d/period, rounded as asked, exact: the
// numerator is at most 10^12 × 10^6 × d in microseconds, which 128 bits hold.
func accrued(rate int64, ppm uint32, d, period time.Duration, up bool) int64 {
	q, r := accruedRem(rate, ppm, d, period, 0)
	if up && r != 0 {
		q++
	}
	return min(q, MaxAmount)
}

// accruedRem is (rate × ppm × d + rem) / (period × ShareUnit), d in
// microseconds: the quotient (saturating at MaxAmount, with a zero
// remainder) and the remainder.
func accruedRem(rate int64, ppm uint32, d, period time.Duration, rem uint64) (int64, uint64) {
	if rate <= 0 || ppm == 0 || d <= 0 {
		return 0, rem
	}
	hi, lo := bits.Mul64(uint64(rate)*uint64(ppm), uint64(d/time.Microsecond))
	var c uint64
	lo, c = bits.Add64(lo, rem, 0)
	hi += c
	div := uint64(period/time.Microsecond) * ShareUnit
	if hi >= div {
		return MaxAmount, 0
	}
	q, r := bits.Div64(hi, lo, div)
	if q > MaxAmount {
		return MaxAmount, 0
	}
	return int64(q), r
}

// Remainder is the fraction of a unit a share's accrual left over, per
// dimension, in units of 1/(Period in microseconds × ShareUnit) of the
// key's limits.
type Remainder struct{ Requests, Tokens uint64 }

// AccruedCarry is Accrued rounded down, with rem, the fraction left over by
// an earlier share of the same key, added first; it returns the new
// fraction left over. A spender whose share is renewed every few seconds
// carries it from one share to the next, so rounding loses it nothing: the
// result still never exceeds the allocator's count (Accrued rounded up over
// a span at least as long), since rem is less than one unit.
func (l Limits) AccruedCarry(s Share, d time.Duration, rem Remainder) (Amount, Remainder) {
	p := l.Period()
	r, rr := accruedRem(l.RPM, s.Requests, d, p, rem.Requests)
	t, rt := accruedRem(l.TPM, s.Tokens, d, p, rem.Tokens)
	return Amount{Requests: r, Tokens: t}, Remainder{Requests: rr, Tokens: rt}
}

// AccrualTime returns how long share s of l's refill rate takes to add n
// (whole units per dimension, the longer of the two), rounded up to the
// microsecond; ok is false when a dimension with n > 0 has no share, so
// the share never covers it.
func (l Limits) AccrualTime(s Share, n Amount) (d time.Duration, ok bool) {
	p := l.Period()
	dr, okr := accrualTime(l.RPM, s.Requests, n.Requests, p, 0)
	dt, okt := accrualTime(l.TPM, s.Tokens, n.Tokens, p, 0)
	return max(dr, dt), okr && okt
}

// NextAccrual returns the shortest d at which AccruedCarry(s, d, rem)
// exceeds total in some dimension (a whole number of microseconds); ok is
// false when it never does: no dimension has both a rate and a share, or
// those that do are at MaxAmount already. Until d, a look at the accrual
// finds nothing new.
func (l Limits) NextAccrual(s Share, total Amount, rem Remainder) (d time.Duration, ok bool) {
	p := l.Period()
	d = 1<<63 - 1
	for _, x := range [2]struct {
		rate  int64
		ppm   uint32
		total int64
		rem   uint64
	}{{l.RPM, s.Requests, total.Requests, rem.Requests}, {l.TPM, s.Tokens, total.Tokens, rem.Tokens}} {
		if x.rate <= 0 || x.ppm == 0 || x.total >= MaxAmount {
			continue
		}
		dx, _ := accrualTime(x.rate, x.ppm, x.total+1, p, x.rem)
		d, ok = min(d, dx), true
	}
	return d, ok
}

// accrualTime is how long ppm of rate takes to accrue n whole units with
// rem (less than one unit, as AccruedRem counts it) carried in: the least
// d in microseconds with rate × ppm × d + rem >= n × period × ShareUnit.
func accrualTime(rate int64, ppm uint32, n int64, period time.Duration, rem uint64) (time.Duration, bool) {
	if rate <= 0 || n <= 0 {
		return 0, true
	}
	if ppm == 0 {
		return 0, false
	}
	// (n × period × ShareUnit − rem) / (rate × ppm) microseconds, rounded up.
	hi, lo := bits.Mul64(uint64(n), uint64(period/time.Microsecond)*ShareUnit)
	var b uint64
	lo, b = bits.Sub64(lo, rem, 0)
	hi -= b
	div := uint64(rate) * uint64(ppm)
	if hi >= div {
		return 1<<63 - 1, true
	}
	q, r := bits.Div64(hi, lo, div)
	if r != 0 {
		q++
	}
	if q > uint64(1<<63-1)/uint64(time.Microsecond) {
		return 1<<63 - 1, true
	}
	return time.Duration(q) * time.Microsecond, true
}
