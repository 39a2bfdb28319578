package spenderhttp

import (
	"fmt"
	"net/http"
	"time"

	"github.com/rationhq/ration/internal/oaierror"
	"github.com/rationhq/ration/spender"
)

// OpenAI error types and codes the stage answers with.
const (
	typeRateLimit      = "rate_limit_error"
	typeInvalidRequest = "invalid_request_error"
	typeServer         = "server_error"

	codeRateLimited     = "rate_limit_exceeded"
	codeTooLarge        = "request_too_large"
	codeInvalidValue    = "invalid_value"
	codeInvalidAPIKey   = "invalid_api_key"
	codeInvalidLimits   = "invalid_rate_limits"
	codeUnreadableBody  = "unreadable_body"
	codeBodyTimeout     = "request_timeout"
	codeOverloaded      = "server_overloaded"
	codeLimiterUnusable = "rate_limiter_unavailable"
)

// writeError answers with status and the OpenAI error body
// ({"error":{"message","type","param","code"}}); param and code may be ""
// for null.
func writeError(w http.ResponseWriter, status int, typ, code, param, msg string) {
	oaierror.Write(w, status, typ, code, param, msg)
}

// budgetName is how a refusal names the budget that ran out: as OpenAI
// does for a key's own per-minute limits ("requests per min (RPM)",
// "tokens per min (TPM)"), with the meter and window of others ("input
// tokens per day (ITPD)") and, for another scope, the budget itself
// (`tokens per min (TPM) of the team budget "team:acme"`).
func budgetName(b budgetRef, d spender.Dimension) string {
	unit, abbr := "requests", "R"
	if d == spender.Tokens {
		switch b.meter {
		case InputTokens:
			unit, abbr = "input tokens", "ITP"
		case OutputTokens:
			unit, abbr = "output tokens", "OTP"
		default:
			unit, abbr = "tokens", "TP"
		}
	} else {
		abbr = "RP"
	}
	var name string
	switch b.window {
	case 0, time.Minute:
		name = fmt.Sprintf("%s per min (%sM)", unit, abbr)
	case time.Hour:
		name = fmt.Sprintf("%s per hour (%sH)", unit, abbr)
	case 24 * time.Hour:
		name = fmt.Sprintf("%s per day (%sD)", unit, abbr)
	default:
		name = fmt.Sprintf("%s per %v", unit, b.window)
	}
	if b.scope != "key" && b.scope != "" {
		name += fmt.Sprintf(" of the %s budget %q", b.scope, b.key)
	}
	return name
}

// rejectMessage is the 429 message: which budget ran out, by how much, and
// when to come back, or that the request can never fit.
func rejectMessage(e *spender.RejectError, b budgetRef) string {
	limit, remaining, requested := e.Status.LimitTokens, e.Status.RemainingTokens, e.Cost.Tokens
	if e.Dimension == spender.Requests {
		limit, remaining, requested = e.Status.LimitRequests, e.Status.RemainingRequests, e.Cost.Requests
	}
	if e.Oversize {
		return fmt.Sprintf("Request too large on %s: Limit %d, Requested %d. "+
			"This request can never be admitted under this limit; "+
			"shorten the prompt or lower max_tokens. Retrying will not help.",
			budgetName(b, e.Dimension), limit, requested)
	}
	wait := ceilDuration(max(e.RetryAfter, time.Millisecond), time.Millisecond)
	return fmt.Sprintf("Rate limit reached on %s: Limit %d, Remaining %d, Requested %d. "+
		"Please try again in %v (Retry-After: %d seconds).",
		budgetName(b, e.Dimension), limit, max(remaining, 0), requested, wait,
		spender.RetryAfterSeconds(e.RetryAfter))
}
