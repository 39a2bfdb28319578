package lease

import (
	"math/bits"

	"github.com/rationhq/ration"
)

// FallbackShareOf is this spender's part of lim while the allocator is
// unreachable: per dimension, its own refill share (own, from its last
// answer) plus an even part, among the n active spenders, of the rate no
// share took (shared, as that answer reported). Without shares it is lim
// divided among n. Every spender doing this takes the rate between them
// (as of their answers), and a busy spender beside idle ones keeps what
// its demand was given. At least 1 per limited dimension.
func FallbackShareOf(lim ration.Limits, own, shared ration.Share, n int64) ration.Limits {
	part := func(v int64, own, shared uint32) int64 {
		if v == 0 {
			return 0
		}
		unshared := uint64(ration.ShareUnit - min(shared, ration.ShareUnit))
		m := uint64(min(max(n, 1), 1<<32)) // so that ShareUnit × m fits
		return max(1, scale(v, min(uint64(own)*m+unshared, ration.ShareUnit*m), ration.ShareUnit*m))
	}
	capacity := lim.Capacity()
	return ration.Limits{
		RPM: part(lim.RPM, own.Requests, shared.Requests), TPM: part(lim.TPM, own.Tokens, shared.Tokens),
		BurstRequests: part(capacity.Requests, own.Requests, shared.Requests),
		BurstTokens:   part(capacity.Tokens, own.Tokens, shared.Tokens),
		Window:        lim.Window,
	}
}

// fallbackStart is what fallback buckets at part (FallbackShareOf of lim)
// start with, per dimension: that part of rem, what the key's global
// buckets held at the last answer. While every spender falls back from its
// own part the fleet starts with at most what the global buckets held, and
// each spender with at most its part's capacity.
func fallbackStart(lim, part ration.Limits, rem ration.Amount) ration.Amount {
	c, pc := lim.Capacity(), part.Capacity()
	of := func(rem, c, pc int64) int64 {
		if rem <= 0 || c <= 0 {
			return 0
		}
		return min(pc, scale(min(rem, c), uint64(min(pc, c)), uint64(c)))
	}
	return ration.Amount{Requests: of(rem.Requests, c.Requests, pc.Requests), Tokens: of(rem.Tokens, c.Tokens, pc.Tokens)}
}

// scale is v × num / den rounded down, for 0 <= v and num <= den (so the
// quotient fits), without overflow.
func scale(v int64, num, den uint64) int64 {
	hi, lo := bits.Mul64(uint64(v), num)
	q, _ := bits.Div64(hi, lo, den)
	return int64(q)
}
