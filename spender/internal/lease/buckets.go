package lease

import (
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// Dim names one of a key's two budgets (the values of spender.Dimension).
type Dim uint8

const (
	Requests Dim = iota + 1 // the requests-per-window budget
	Tokens                  // the tokens-per-window budget
)

// Buckets is a pair of token buckets, requests and tokens, at limits Lim:
// a standalone Limiter's key, or a leased key's fallback. A dimension Lim
// leaves unlimited has no bucket and is never consulted. It is not safe
// for concurrent use.
type Buckets struct {
	Lim      ration.Limits
	Req, Tok bucket.Bucket // valid only while Lim.RPM > 0, Lim.TPM > 0
}

// NewBuckets returns full buckets for lim at now. lim must be valid.
func NewBuckets(lim ration.Limits, now bucket.Instant) Buckets {
	b := Buckets{Lim: lim}
	if bl, ok := lim.RequestLimit(); ok {
		b.Req, _ = bucket.New(bl, now)
	}
	if bl, ok := lim.TokenLimit(); ok {
		b.Tok, _ = bucket.New(bl, now)
	}
	return b
}

// SetLimits makes the buckets follow new, valid limits without minting: a
// limited dimension keeps its level (capped at the new capacity), a newly
// limited one starts full, a newly unlimited one drops its bucket.
func (b *Buckets) SetLimits(lim ration.Limits, now bucket.Instant) {
	follow := func(bk *bucket.Bucket, was bool, bl bucket.Limit, is bool) {
		switch {
		case is && was:
			_ = bk.SetLimit(bl, now) // bl was validated by the caller
		case is:
			*bk, _ = bucket.New(bl, now)
		default:
			*bk = bucket.Bucket{}
		}
	}
	rl, rok := lim.RequestLimit()
	tl, tok := lim.TokenLimit()
	follow(&b.Req, b.Lim.RPM > 0, rl, rok)
	follow(&b.Tok, b.Lim.TPM > 0, tl, tok)
	b.Lim = lim
}

// Advance refills both buckets to now.
func (b *Buckets) Advance(now bucket.Instant) {
	if b.Lim.RPM > 0 {
		b.Req.Advance(now)
	}
	if b.Lim.TPM > 0 {
		b.Tok.Advance(now)
	}
}

// Wait returns how long until c is covered in every dimension (as of the
// last Advance), the dimension that waits longest, and whether c fits at
// all; when it does not, dim is the dimension it exceeds.
func (b *Buckets) Wait(c ration.Amount) (w time.Duration, dim Dim, fits bool) {
	dim = Requests
	if b.Lim.RPM > 0 {
		if !b.Req.Fits(c.Requests) {
			return 0, Requests, false
		}
		w = b.Req.Wait(c.Requests)
	}
	if b.Lim.TPM > 0 {
		if !b.Tok.Fits(c.Tokens) {
			return 0, Tokens, false
		}
		if wt := b.Tok.Wait(c.Tokens); b.Lim.RPM == 0 || wt > w {
			w, dim = wt, Tokens
		}
	}
	return w, dim, true
}

// Take removes c from both buckets (levels may go negative).
func (b *Buckets) Take(c ration.Amount) {
	if b.Lim.RPM > 0 {
		b.Req.Take(c.Requests)
	}
	if b.Lim.TPM > 0 {
		b.Tok.Take(c.Tokens)
	}
}

// Give returns c to both buckets, capped at capacity.
func (b *Buckets) Give(c ration.Amount) {
	if b.Lim.RPM > 0 {
		b.Req.Give(c.Requests)
	}
	if b.Lim.TPM > 0 {
		b.Tok.Give(c.Tokens)
	}
}

// Levels returns both buckets' levels in fixed-point units (0 for an
// unlimited dimension).
func (b *Buckets) Levels() (req, tok int64) {
	if b.Lim.RPM > 0 {
		req, _ = b.Req.Level()
	}
	if b.Lim.TPM > 0 {
		tok, _ = b.Tok.Level()
	}
	return req, tok
}

// FullAt returns the instant from which both buckets are full, so that
// they carry no information.
func (b *Buckets) FullAt() bucket.Instant {
	var at bucket.Instant = -1 << 63
	if b.Lim.RPM > 0 {
		at = b.Req.FullAt()
	}
	if b.Lim.TPM > 0 {
		at = max(at, b.Tok.FullAt())
	}
	return at
}
