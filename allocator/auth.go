package allocator

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"

	"connectrpc.com/connect/v2"
)

// BearerAuth returns a server interceptor that admits a call only if its
// Authorization header is "Bearer <t>" for one of tokens, and otherwise
// fails it with CodeUnauthenticated before any work is done; an admitted
// call's context carries the token's TokenID (WithCredential). Tokens are
// compared as SHA-256 digests in constant time, against every token, so
// neither the match nor the length leaks through timing.
//
// Refused calls are logged on log (nil: not logged) at a sampled rate, the
// 1st, 2nd, 4th, 8th... and every 1000th with the running count, so that a
// gateway with the wrong token shows up here without flooding the log.
func BearerAuth(tokens []string, log *slog.Logger) connect.ServerInterceptor {
	b := newBearer(tokens, log)
	return func(next connect.ServerFunc) connect.ServerFunc {
		return func(ctx context.Context, spec connect.Spec, stream connect.ServerStream) error {
			info, ok := connect.CallInfoForServerContext(ctx)
			if !ok {
				return connect.NewError(connect.CodeUnauthenticated, "allocator: missing or invalid bearer token")
			}
			id, ok := b.admit(info.RequestHeader().Get("Authorization"), spec.Procedure)
			if !ok {
				return connect.NewError(connect.CodeUnauthenticated, "allocator: missing or invalid bearer token")
			}
			return next(WithCredential(ctx, id), spec, stream)
		}
	}
}

// RequireBearer is BearerAuth for a plain HTTP handler: a request without
// a valid bearer token is answered 401, and logged the same way.
func RequireBearer(tokens []string, log *slog.Logger, h http.Handler) http.Handler {
	b := newBearer(tokens, log)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := b.admit(r.Header.Get("Authorization"), r.Method+" "+r.URL.Path); !ok {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "allocator: missing or invalid bearer token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// bearer checks bearer tokens and logs refusals at a sampled rate.
type bearer struct {
	sums    [][32]byte
	log     *slog.Logger
	refused atomic.Uint64
}

func newBearer(tokens []string, log *slog.Logger) *bearer {
	b := &bearer{sums: make([][32]byte, len(tokens)), log: log}
	for i, t := range tokens {
		b.sums[i] = sha256.Sum256([]byte(t))
	}
	return b
}

// admit reports whether header carries one of the tokens, with its
// TokenID, and logs a refusal of what (a procedure or a path).
func (b *bearer) admit(header, what string) (string, bool) {
	if sum, ok := authorized(header, b.sums); ok {
		return tokenIDOf(sum), true
	}
	if n := b.refused.Add(1); b.log != nil && (n&(n-1) == 0 || n%1000 == 0) {
		b.log.Warn("allocator: refused a call without a valid bearer token", "procedure", what, "refused_total", n)
	}
	return "", false
}

// authorized reports whether header carries one of the tokens whose
// digests are sums, with the presented token's digest.
func authorized(header string, sums [][32]byte) (got [32]byte, ok bool) {
	const prefix = "Bearer "
	if len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return got, false
	}
	got = sha256.Sum256([]byte(header[len(prefix):]))
	match := 0
	for i := range sums {
		match |= subtle.ConstantTimeCompare(got[:], sums[i][:])
	}
	return got, match == 1
}
