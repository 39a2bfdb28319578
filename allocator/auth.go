package allocator

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"strings"
	"sync/atomic"

	"connectrpc.com/connect/v2"
)

// BearerAuth returns a server interceptor that admits a call only if its
// Authorization header is "Bearer <t>" for one of tokens, and otherwise
// fails it with CodeUnauthenticated before any work is done. Tokens are
// compared as SHA-256 digests in constant time, against every token, so
// neither the match nor the length leaks through timing.
//
// Refused calls are logged on log (nil: not logged) at a sampled rate, the
// 1st, 2nd, 4th, 8th... and every 1000th with the running count, so that a
// gateway with the wrong token shows up here without flooding the log.
func BearerAuth(tokens []string, log *slog.Logger) connect.ServerInterceptor {
	sums := make([][32]byte, len(tokens))
	for i, t := range tokens {
		sums[i] = sha256.Sum256([]byte(t))
	}
	var refused atomic.Uint64
	return func(next connect.ServerFunc) connect.ServerFunc {
		return func(ctx context.Context, spec connect.Spec, stream connect.ServerStream) error {
			info, ok := connect.CallInfoForServerContext(ctx)
			if !ok || !authorized(info.RequestHeader().Get("Authorization"), sums) {
				if n := refused.Add(1); log != nil && (n&(n-1) == 0 || n%1000 == 0) {
					log.Warn("allocator: refused a call without a valid bearer token", "procedure", spec.Procedure, "refused_total", n)
				}
				return connect.NewError(connect.CodeUnauthenticated, "allocator: missing or invalid bearer token")
			}
			return next(ctx, spec, stream)
		}
	}
}

func authorized(header string, sums [][32]byte) bool {
	const prefix = "Bearer "
	if len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return false
	}
	got := sha256.Sum256([]byte(header[len(prefix):]))
	ok := 0
	for i := range sums {
		ok |= subtle.ConstantTimeCompare(got[:], sums[i][:])
	}
	return ok == 1
}
