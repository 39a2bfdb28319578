package spenderhttp

import (
	"context"

	"github.com/rationhq/ration"
)

// Principal is the caller as the authentication stage established it. The
// middleware spends the budget of KeyID with Limits; Tenant is carried for
// the stages that need it and never selects a budget, so two keys of one
// tenant never spend each other's.
type Principal struct {
	KeyID  string        // the API key's stable ID (not the secret); the budget key
	Tenant string        // the owning tenant; informational here
	Limits ration.Limits // the key's budgets; a rate of 0 is unlimited

	// Budgets are more budgets the request is charged to, all or nothing
	// with the key's own Limits (which come first, as scope "key", when
	// they limit anything): a team's, a model-wide cap, the key's per-day
	// limits, its input or output tokens. The limiter must then be a
	// MultiReserver. Empty: the key's Limits alone.
	Budgets []Budget

	// Models are more budgets for requests that name a model (the body's
	// "model", matched exactly): the key's limits on that model, the
	// model's cap over every key. They are charged with Budgets.
	Models map[string][]Budget
}

// Budget is one budget a request is charged to beside its key's own
// Limits.
type Budget struct {
	// Key is the budget's id in the limiter (and the allocator), shared by
	// every request charged to it: "team:acme", "model:gpt-4o",
	// "key:sk-1/day". It must not collide with a key's KeyID.
	Key string
	// Scope says what the budget limits, in refusals and in the IETF
	// headers' policy names: "team", "model", "key", ...
	Scope  string
	Limits ration.Limits // its limits; Window for per-day ones
	Meter  Meter         // what its tokens count
}

// Meter says which tokens a budget counts.
type Meter uint8

const (
	// TotalTokens counts prompt and completion tokens together, as an
	// OpenAI TPM limit does (the key's own Limits always do).
	TotalTokens Meter = iota
	// InputTokens counts the prompt: reserved from the prompt estimate,
	// settled from usage's prompt_tokens (or input_tokens).
	InputTokens
	// OutputTokens counts the completion: reserved from max_tokens (or the
	// default completion budget), settled from completion_tokens (or
	// output_tokens).
	OutputTokens
)

// String returns "tokens", "input-tokens" or "output-tokens", as the
// headers name them.
func (m Meter) String() string {
	switch m {
	case InputTokens:
		return "input-tokens"
	case OutputTokens:
		return "output-tokens"
	}
	return "tokens"
}

// principalKey is the context key for a Principal; its type is unexported
// so no other package can collide with it.
type principalKey struct{}

// WithPrincipal returns a copy of ctx that carries p. The authentication
// stage calls it before Middleware runs.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the Principal that ctx carries and reports whether
// there is one.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}
