package spenderhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

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
	codeLimiterUnusable = "rate_limiter_unavailable"
)

// apiError is the OpenAI error body:
// {"error":{"message":...,"type":...,"param":...,"code":...}}.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"` // null unless one field is at fault
	Code    *string `json:"code"`
}

// writeError answers with status and the OpenAI error body. param may be
// "" for null.
func writeError(w http.ResponseWriter, status int, typ, code, param, msg string) {
	body := apiError{Error: apiErrorBody{Message: msg, Type: typ}}
	if param != "" {
		body.Error.Param = &param
	}
	if code != "" {
		body.Error.Code = &code
	}
	b, _ := json.Marshal(body) // cannot fail: strings and pointers only
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(b) + 1)}
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// dimensionName is how OpenAI names a budget in its messages.
func dimensionName(d spender.Dimension) string {
	if d == spender.Requests {
		return "requests per min (RPM)"
	}
	return "tokens per min (TPM)"
}

// rejectMessage is the 429 message: which budget ran out, by how much, and
// when to come back, or that the request can never fit.
func rejectMessage(e *spender.RejectError) string {
	limit, remaining, requested := e.Status.LimitTokens, e.Status.RemainingTokens, e.Cost.Tokens
	if e.Dimension == spender.Requests {
		limit, remaining, requested = e.Status.LimitRequests, e.Status.RemainingRequests, e.Cost.Requests
	}
	if e.Oversize {
		return fmt.Sprintf("Request too large on %s: Limit %d, Requested %d. "+
			"This request can never be admitted under this key's limit; "+
			"shorten the prompt or lower max_tokens. Retrying will not help.",
			dimensionName(e.Dimension), limit, requested)
	}
	wait := ceilDuration(max(e.RetryAfter, time.Millisecond), time.Millisecond)
	return fmt.Sprintf("Rate limit reached on %s: Limit %d, Remaining %d, Requested %d. "+
		"Please try again in %v (Retry-After: %d seconds).",
		dimensionName(e.Dimension), limit, max(remaining, 0), requested, wait,
		spender.RetryAfterSeconds(e.RetryAfter))
}
