package ration

import (
	"errors"
	"fmt"
	"time"

	"github.com/rationhq/ration/bucket"
)

// ErrInvalidLimits is matched (errors.Is) by every error of
// [Limits.Validate].
var ErrInvalidLimits = errors.New("ration: invalid limits")

// LimitsError is the error of [Limits.Validate]: which field is wrong and
// why. It matches ErrInvalidLimits.
type LimitsError struct {
	Field  string // rpm, tpm, burst_requests or burst_tokens, as the keys file and the protocol spell them
	Reason string // what is wrong with it
}

// Error returns "ration: invalid limits: <field>: <reason>".
func (e *LimitsError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrInvalidLimits, e.Field, e.Reason)
}

// Unwrap returns ErrInvalidLimits.
func (e *LimitsError) Unwrap() error { return ErrInvalidLimits }

// Limits are a key's budgets. A rate of 0 means unlimited: that dimension
// has no bucket, is never short and reports no headers. A burst of 0 means
// one window's budget (capacity = the rate). Each limited dimension is a
// token bucket of that capacity, refilled continuously at rate per window
// and starting full.
//
// The window is a minute unless Window says otherwise: with Window 24h,
// RPM and TPM are requests and tokens per day (a bucket that holds a day's
// budget and refills it over a day). A per-minute and a per-day limit on
// the same traffic are two budgets (see spender.Limiter.ReserveAll).
type Limits struct {
	RPM           int64         // requests per window, 0 to MaxRate; 0 = unlimited
	TPM           int64         // tokens per window, 0 to MaxRate; 0 = unlimited
	BurstRequests int64         // request bucket capacity in requests, 0 to MaxRate; 0 = RPM
	BurstTokens   int64         // token bucket capacity in tokens, 0 to MaxRate; 0 = TPM
	Window        time.Duration // the period RPM and TPM refill over: 0 (a minute), or whole seconds up to MaxWindow
}

// Period returns the window RPM and TPM refill over: Window, or a minute
// when it is 0.
func (l Limits) Period() time.Duration {
	if l.Window == 0 {
		return time.Minute
	}
	return l.Window
}

// Unlimited reports whether neither dimension is limited.
func (l Limits) Unlimited() bool { return l.RPM == 0 && l.TPM == 0 }

// RequestLimit returns the request dimension's bucket and whether that
// dimension is limited at all.
func (l Limits) RequestLimit() (bucket.Limit, bool) {
	return dimLimit(l.RPM, l.BurstRequests, l.Period())
}

// TokenLimit returns the token dimension's bucket and whether that
// dimension is limited at all.
func (l Limits) TokenLimit() (bucket.Limit, bool) { return dimLimit(l.TPM, l.BurstTokens, l.Period()) }

// Capacity returns each dimension's bucket capacity (the burst, or the
// rate); 0 for an unlimited dimension.
func (l Limits) Capacity() Amount {
	return Amount{Requests: capacity(l.RPM, l.BurstRequests), Tokens: capacity(l.TPM, l.BurstTokens)}
}

// Limited returns a with the dimensions that l leaves unlimited set to 0:
// nothing is reserved, leased or reported on them.
func (l Limits) Limited(a Amount) Amount {
	if l.RPM == 0 {
		a.Requests = 0
	}
	if l.TPM == 0 {
		a.Tokens = 0
	}
	return a
}

// Validate reports whether l is a budget every part of ration can hold
// exactly: every field in [0, MaxRate], and each limited dimension a valid
// bucket.Limit. The error is a *LimitsError naming the field.
func (l Limits) Validate() error {
	for _, f := range [...]struct {
		name string
		v    int64
	}{{"rpm", l.RPM}, {"tpm", l.TPM}, {"burst_requests", l.BurstRequests}, {"burst_tokens", l.BurstTokens}} {
		if f.v < 0 || f.v > MaxRate {
			return &LimitsError{Field: f.name, Reason: fmt.Sprintf("%d outside [0, %d]", f.v, int64(MaxRate))}
		}
	}
	if l.Window != 0 && (l.Window < time.Second || l.Window > MaxWindow || l.Window%time.Second != 0) {
		return &LimitsError{Field: "window", Reason: fmt.Sprintf("%v is not 0 (a minute) or whole seconds from 1s to %v", l.Window, MaxWindow)}
	}
	if b, ok := l.RequestLimit(); ok {
		if err := b.Validate(); err != nil {
			return &LimitsError{Field: "rpm", Reason: err.Error()}
		}
	}
	if b, ok := l.TokenLimit(); ok {
		if err := b.Validate(); err != nil {
			return &LimitsError{Field: "tpm", Reason: err.Error()}
		}
	}
	return nil
}

func dimLimit(rate, burst int64, period time.Duration) (bucket.Limit, bool) {
	if rate == 0 {
		return bucket.Limit{}, false
	}
	return bucket.Limit{Capacity: capacity(rate, burst), Refill: rate, Period: period}, true
}

func capacity(rate, burst int64) int64 {
	if rate == 0 {
		return 0
	}
	if burst > 0 {
		return burst
	}
	return rate
}
