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
	hdrAnthInputLimit        = "Anthropic-Ratelimit-Input-Tokens-Limit"
	hdrAnthInputRemaining    = "Anthropic-Ratelimit-Input-Tokens-Remaining"
	hdrAnthInputReset        = "Anthropic-Ratelimit-Input-Tokens-Reset"
	hdrAnthOutputLimit       = "Anthropic-Ratelimit-Output-Tokens-Limit"
	hdrAnthOutputRemaining   = "Anthropic-Ratelimit-Output-Tokens-Remaining"
	hdrAnthOutputReset       = "Anthropic-Ratelimit-Output-Tokens-Reset"

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

// headerSet computes the headers SetHeaders writes for s: one budget, the
// key's, per minute.
func (c *config) headerSet(s spender.Status) headerSet {
	return c.headerSetOf([]budgetView{{budgetRef: budgetRef{scope: "key", window: time.Minute}, st: s}})
}

// budgetView is one budget's state right after a reservation.
type budgetView struct {
	budgetRef
	st spender.Status
}

// dimState is one dimension of one budget: its capacity, what remains and
// until when it refills.
type dimState struct {
	limit, remaining int64
	reset            time.Duration
}

// tightest returns, among the views that keep, the dimension dim that
// limits most: the fewest units remaining, then the smallest limit. ok is
// false when no view limits that dimension.
func tightest(views []budgetView, keep func(*budgetView) bool, dim func(spender.Status) dimState) (d dimState, ok bool) {
	for i := range views {
		v := &views[i]
		if !keep(v) {
			continue
		}
		x := dim(v.st)
		if x.limit <= 0 {
			continue
		}
		if !ok || x.remaining < d.remaining || x.remaining == d.remaining && x.limit < d.limit {
			d, ok = x, true
		}
	}
	return d, ok
}

func requestsOf(s spender.Status) dimState {
	return dimState{s.LimitRequests, s.RemainingRequests, s.ResetRequests}
}

func tokensOf(s spender.Status) dimState {
	return dimState{s.LimitTokens, s.RemainingTokens, s.ResetTokens}
}

func anyBudget(*budgetView) bool { return true }

func metered(m Meter) func(*budgetView) bool {
	return func(v *budgetView) bool { return v.meter == m }
}

// headerSetOf computes the headers for a request charged to views (see
// docs/http.md, "Which budget each header describes"):
//
//   - x-ratelimit-*-requests: the budget with the fewest requests left;
//     x-ratelimit-*-tokens: the same among the budgets that count all
//     tokens (OpenAI's TPM).
//   - anthropic-ratelimit-requests-*, -input-tokens-*, -output-tokens-*:
//     the tightest budget of each; -tokens-*: the tightest of every token
//     budget, as Anthropic reports its most restrictive token limit.
//   - RateLimit-Policy and RateLimit: every budget and dimension, each
//     policy named for its scope, meter and window ("requests", "tokens"
//     for the key's own per-minute limits; "team-tokens",
//     "key-input-tokens", "key-requests-day", ...).
func (c *config) headerSetOf(views []budgetView) headerSet {
	req, hasReq := tightest(views, anyBudget, requestsOf)
	tok, hasTok := tightest(views, metered(TotalTokens), tokensOf)
	anyTok, hasAnyTok := tightest(views, anyBudget, tokensOf)
	if !hasReq && !hasAnyTok {
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
	if hasReq {
		add(hdrLimitRequests, strconv.FormatInt(req.limit, 10))
		add(hdrRemainingRequests, strconv.FormatInt(max(req.remaining, 0), 10))
		add(hdrResetRequests, resetString(req.reset))
	}
	if hasTok {
		add(hdrLimitTokens, strconv.FormatInt(tok.limit, 10))
		add(hdrRemainingTokens, strconv.FormatInt(max(tok.remaining, 0), 10))
		add(hdrResetTokens, resetString(tok.reset))
	}
	if c.anthropic {
		now := c.clock.Now()
		anth := func(limit, remaining, reset string, d dimState) {
			add(limit, strconv.FormatInt(d.limit, 10))
			add(remaining, strconv.FormatInt(max(d.remaining, 0), 10))
			add(reset, resetInstant(now, d.reset))
		}
		if hasReq {
			anth(hdrAnthRequestsLimit, hdrAnthRequestsRemaining, hdrAnthRequestsReset, req)
		}
		if hasAnyTok {
			anth(hdrAnthTokensLimit, hdrAnthTokensRemaining, hdrAnthTokensReset, anyTok)
		}
		if d, ok := tightest(views, metered(InputTokens), tokensOf); ok {
			anth(hdrAnthInputLimit, hdrAnthInputRemaining, hdrAnthInputReset, d)
		}
		if d, ok := tightest(views, metered(OutputTokens), tokensOf); ok {
			anth(hdrAnthOutputLimit, hdrAnthOutputRemaining, hdrAnthOutputReset, d)
		}
	}
	if c.ietf {
		var policy, state []byte
		for i := range views {
			v := &views[i]
			if d := requestsOf(v.st); d.limit > 0 {
				name := policyName(v.scope, "requests", v.window)
				policy = appendPolicy(policy, name, d.limit, "", v.window)
				state = appendState(state, name, d.remaining, d.reset)
			}
			if d := tokensOf(v.st); d.limit > 0 {
				name := policyName(v.scope, v.meter.String(), v.window)
				policy = appendPolicy(policy, name, d.limit, "tokens", v.window)
				state = appendState(state, name, d.remaining, d.reset)
			}
		}
		add(hdrIETFPolicy, string(policy))
		add(hdrIETF, string(state))
	}
	return hs
}

// policyName names an IETF policy: the dimension for the key's own
// per-minute limits ("requests", "tokens"), prefixed by any other scope
// and suffixed by any other window ("team-tokens", "key-requests-day").
func policyName(scope, dim string, window time.Duration) string {
	name := dim
	if scope != "key" && scope != "" {
		name = scope + "-" + dim
	}
	switch window {
	case time.Minute:
	case time.Hour:
		name += "-hour"
	case 24 * time.Hour:
		name += "-day"
	default:
		name += "-" + strconv.FormatInt(int64(window/time.Second), 10) + "s"
	}
	return name
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

func appendPolicy(b []byte, name string, quota int64, unit string, window time.Duration) []byte {
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
	b = append(b, ";w="...)
	return strconv.AppendInt(b, int64(window/time.Second), 10)
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
