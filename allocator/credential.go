package allocator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

// TokenID is the credential a bearer token stands for in the ledger: the
// first 16 hex digits of its SHA-256 (what `printf %s TOKEN | sha256sum`
// prints first), so a token never appears in the state, the journal or a
// log. A spender id belongs to the TokenID whose call created its session,
// and each TokenID's sessions, keys and leases count against its own
// quota (WithQuota). Several tokens of a token file are several
// credentials: rotating a token makes a new one (docs/allocator.md, "Auth").
func TokenID(token string) string { return tokenIDOf(sha256.Sum256([]byte(token))) }

func tokenIDOf(sum [sha256.Size]byte) string { return hex.EncodeToString(sum[:8]) }

type credentialKey struct{}

// WithCredential returns ctx carrying the credential (a TokenID) a lease
// call was authenticated with. BearerAuth sets it; the Service passes it to
// the ledger as Caller.Credential. A call without one is the credential "",
// as with -no-auth or in-process calls.
func WithCredential(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, credentialKey{}, id)
}

// credentialOf is the credential WithCredential put in ctx, "" if none.
func credentialOf(ctx context.Context) string {
	id, _ := ctx.Value(credentialKey{}).(string)
	return id
}
