package spenderhttp

import (
	"net/http"
	"strconv"
	"time"

	"github.com/rationhq/ration/spender"
)

// Header names, already in canonical form so they can be stored without
// canonicalising on every request.
const (
	hdrLimitRequests     = "X-Ratelimit-Limit-Requests"
	hdrRemainingRequests = "X-Ratelimit-Remaining-Requests"
	hdrResetRequests     = "X-Ratelimit-Reset-Requests"
	hdrLimitTokens       = "X-Ratelimit-Limit-Tokens"
	hdrRemainingTokens   = "X-Ratelimit-Remaining-Tokens"
	hdrResetTokens       = "X-Ratelimit-Reset-Tokens"
	hdrRetryAfter        = "Retry-After"

	hdrAnthRequestsLimit     = "Anthropic-Ratelimit-Requests-Limit"
	hdrAnthRequestsRemaining = "Anthropic-Ratelimit-Requests-Remaining"
	hdrAnthRequestsReset     = "Anthropic-Ratelimit-Requests-Reset"
	hdrAnthTokensLimit       = "Anthropic-Ratelimit-Tokens-Limit"
	hdrAnthTokensRemaining   = "Anthropic-Ratelimit-Tokens-Remaining"
	hdrAnthTokensReset       = "Anthropic-Ratelimit-Tokens-Reset"

	hdrIETFPolicy = "Ratelimit-Policy"
	hdrIETF       = "Ratelimit"
)

// SetHeaders writes a key's budget into h as OpenAI does (docs/contract.md):
//
//	x-ratelimit-limit-requests      request bucket capacity
//	x-ratelimit-remaining-requests  whole requests left, at least 0
//	x-ratelimit-reset-requests      until the request bucket is full, e.g. "1s"
//	x-ratelimit-limit-tokens        token bucket capacity
//	x-ratelimit-remaining-tokens    whole tokens left, at least 0
//	x-ratelimit-reset-tokens        until the token bucket is full, e.g. "18s"
//
// Resets are Go duration strings rounded up to the millisecond ("18s",
// "1.2s", "6m0s", "0s"). A dimension whose limit is 0 is unlimited and gets
// no headers; existing values of the headers written are replaced. The
// options WithAnthropicHeaders and WithIETFHeaders add those families;
// other options are ignored.
func SetHeaders(h http.Header, s spender.Status, opts ...Option) {
	c := newConfig(opts)
	c.setHeaders(h, s)
}

// setHeaders is SetHeaders with the configuration already built.
func (c *config) setHeaders(h http.Header, s spender.Status) {
	c.headerSet(s).apply(h)
}

// headerKV is one header, its name canonical.
type headerKV struct {
	name  string
	value []string
}

// headerSet is the budget headers of one Status, computed once and
// applied as often as needed (before the handler runs and again when it
// writes its status) without formatting them again.
type headerSet []headerKV

// apply sets every header of hs in h, replacing existing values.
func (hs headerSet) apply(h http.Header) {
	for _, kv := range hs {
		h[kv.name] = kv.value
	}
}

// headerSet computes the headers SetHeaders writes for s.
func (c *config) headerSet(s spender.Status) headerSet {
	if s.LimitRequests <= 0 && s.LimitTokens <= 0 {
		return nil
	}
	// One backing array for every value: one allocation instead of one
	// per header.
	vals := make([]string, 0, 14)
	hs := make(headerSet, 0, 14)
	add := func(name, v string) {
		vals = append(vals, v)
		hs = append(hs, headerKV{name, vals[len(vals)-1 : len(vals) : len(vals)]})
	}
	if s.LimitRequests > 0 {
		add(hdrLimitRequests, strconv.FormatInt(s.LimitRequests, 10))
		add(hdrRemainingRequests, strconv.FormatInt(max(s.RemainingRequests, 0), 10))
		add(hdrResetRequests, resetString(s.ResetRequests))
	}
	if s.LimitTokens > 0 {
		add(hdrLimitTokens, strconv.FormatInt(s.LimitTokens, 10))
		add(hdrRemainingTokens, strconv.FormatInt(max(s.RemainingTokens, 0), 10))
		add(hdrResetTokens, resetString(s.ResetTokens))
	}
	if c.anthropic {
		now := c.clock.Now()
		if s.LimitRequests > 0 {
			add(hdrAnthRequestsLimit, strconv.FormatInt(s.LimitRequests, 10))
			add(hdrAnthRequestsRemaining, strconv.FormatInt(max(s.RemainingRequests, 0), 10))
			add(hdrAnthRequestsReset, resetInstant(now, s.ResetRequests))
		}
		if s.LimitTokens > 0 {
			add(hdrAnthTokensLimit, strconv.FormatInt(s.LimitTokens, 10))
			add(hdrAnthTokensRemaining, strconv.FormatInt(max(s.RemainingTokens, 0), 10))
			add(hdrAnthTokensReset, resetInstant(now, s.ResetTokens))
		}
	}
	if c.ietf {
		var policy, state []byte
		if s.LimitRequests > 0 {
			policy = appendPolicy(policy, "requests", s.LimitRequests, "")
			state = appendState(state, "requests", s.RemainingRequests, s.ResetRequests)
		}
		if s.LimitTokens > 0 {
			policy = appendPolicy(policy, "tokens", s.LimitTokens, "tokens")
			state = appendState(state, "tokens", s.RemainingTokens, s.ResetTokens)
		}
		add(hdrIETFPolicy, string(policy))
		add(hdrIETF, string(state))
	}
	return hs
}

// resetString formats a reset duration the way OpenAI does, rounded up to
// the millisecond so it never reads earlier than the truth.
func resetString(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return ceilDuration(d, time.Millisecond).String()
}

// resetInstant returns now+d as RFC 3339 in UTC, rounded up to the second.
func resetInstant(now time.Time, d time.Duration) string {
	t := now.Add(max(d, 0)).UTC()
	if t.Nanosecond() != 0 {
		t = t.Truncate(time.Second).Add(time.Second)
	}
	return t.Format(time.RFC3339)
}

// ceilDuration rounds d > 0 up to a multiple of unit.
func ceilDuration(d, unit time.Duration) time.Duration {
	if r := d % unit; r != 0 {
		return d + unit - r
	}
	return d
}

// ceilSeconds returns d in whole seconds, rounded up, at least 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(ceilDuration(d, time.Second) / time.Second)
}

func appendPolicy(b []byte, name string, quota int64, unit string) []byte {
	if len(b) > 0 {
		b = append(b, ", "...)
	}
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, `";q=`...)
	b = strconv.AppendInt(b, quota, 10)
	if unit != "" {
		b = append(b, `;qu="`...)
		b = append(b, unit...)
		b = append(b, '"')
	}
	return append(b, ";w=60"...)
}

func appendState(b []byte, name string, remaining int64, reset time.Duration) []byte {
	if len(b) > 0 {
		b = append(b, ", "...)
	}
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, `";r=`...)
	b = strconv.AppendInt(b, max(remaining, 0), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, ceilSeconds(reset), 10)
}
