package spenderhttp

import (
	"context"

	"github.com/rationhq/ration"
)

// DefaultCompletionTokens is the completion budget, in tokens, that
// EstimateCost reserves per choice when a request sets neither
// max_completion_tokens nor max_tokens (docs/contract.md).
const DefaultCompletionTokens = 256

// EstimateCost returns what a request body is expected to cost before it
// runs: 1 request, and prompt tokens plus completion tokens.
//
// Prompt tokens are counter's count of PromptText(body) plus the token ids
// given directly (integer prompt or input arrays, counted without the
// tokenizer). When counter is nil, fails, or returns less than 1 for
// non-empty text, the text counts ceil(bytes/4) instead, so a non-empty
// prompt never costs 0 tokens. When counter is a MessageCounter and the
// body has chat messages, its CountMessages count of them (with the chat
// format's overhead) replaces the count of their text, unless it fails.
//
// Completion tokens are max_completion_tokens, else max_tokens, else the
// Responses API's max_output_tokens, else DefaultCompletionTokens, times n
// (the number of choices, at most 128). A body with neither prompt nor
// messages (an embeddings request, or none at all) reserves no completion
// tokens unless it sets a max. Negative max values are ignored here; Middleware rejects them with
// 400 before estimating.
//
// A body that is not a JSON object costs ceil(len(body)/4) plus
// DefaultCompletionTokens; an empty body costs 1 request and 0 tokens.
// Token counts saturate at 2^40 instead of overflowing.
func EstimateCost(ctx context.Context, counter Counter, body []byte) ration.Amount {
	req, _ := parseRequest(body, isMessageCounter(counter))
	return estimate(ctx, counter, body, req, DefaultCompletionTokens).cost()
}

// estimateResult splits an estimate into its parts: the middleware
// settles with the prompt part when no usage comes back.
type estimateResult struct {
	prompt     int64 // prompt tokens
	completion int64 // completion tokens reserved, all choices
}

func (e estimateResult) cost() ration.Amount {
	return ration.Amount{Requests: 1, Tokens: satAdd(e.prompt, e.completion)}
}

// estimate is EstimateCost on a parsed body, with the completion budget
// used when no max is set.
func estimate(ctx context.Context, counter Counter, body []byte, req request, defaultCompletion int64) estimateResult {
	if !req.valid {
		if len(body) == 0 {
			return estimateResult{}
		}
		return estimateResult{prompt: ceilQuarter(int64(len(body))), completion: defaultCompletion}
	}
	var e estimateResult
	e.prompt = req.ids
	counted := false
	if mc, ok := counter.(MessageCounter); ok && len(req.messages) > 0 {
		if n, err := mc.CountMessages(ctx, req.model, req.messages); err == nil && n >= 1 {
			e.prompt = satAdd(e.prompt, min(n, maxTokenCount))
			e.prompt = satAdd(e.prompt, countText(ctx, counter, req.model, req.rest))
			counted = true
		}
	}
	if !counted {
		e.prompt = satAdd(e.prompt, countText(ctx, counter, req.model, req.text))
	}
	switch {
	case req.maxField != "":
		e.completion = satMul(req.maxOut, req.choices)
	case req.generates:
		e.completion = satMul(defaultCompletion, req.choices)
	}
	return e
}

// isMessageCounter reports whether counter counts chat messages itself,
// so that parseRequest keeps them.
func isMessageCounter(counter Counter) bool {
	_, ok := counter.(MessageCounter)
	return ok
}

// countText is counter's count of text, or ceil(bytes/4) when counter is
// nil, fails or counts less than 1 for non-empty text; at most
// maxTokenCount.
func countText(ctx context.Context, counter Counter, model, text string) int64 {
	if text == "" {
		return 0
	}
	n := int64(0)
	if counter != nil {
		if c, err := counter.CountTokens(ctx, model, text); err == nil {
			n = c
		}
	}
	if n < 1 {
		n = ceilQuarter(int64(len(text)))
	}
	return min(n, maxTokenCount)
}
