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
