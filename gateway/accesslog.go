package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/rationhq/ration/spender/spenderhttp"
)

// maxLoggedPath bounds the path and method an access log line repeats:
// a client chooses them, up to the header limit.
const maxLoggedPath = 256

// access is what the stages behind the access log learn of one request.
type access struct {
	key      string // the key's id (never its secret); "" before authentication or without a valid key
	decided  bool
	decision spenderhttp.Decision
}

type accessKey struct{}

// accessLog returns next, logging one line per request on log at INFO
// once the answer is done:
//
//	msg="gateway: request" method=POST path=/v1/chat/completions key=team-a-prod status=200 bytes=512 duration=1.2ms limit=admitted
//	msg="gateway: request" ... status=429 ... limit=refused budget=tenant:acme dimension=tokens
//
// key is the key's id from the keys file, never the secret, and absent
// for a request without a valid key; limit is absent for a request the
// limit stage did not reserve for (GET, or one refused before: 400, 413).
// bytes counts the response body.
func accessLog(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		a := &access{}
		sw := &statusWriter{ResponseWriter: w}
		defer func() { // also when the proxy aborts a broken stream
			attrs := make([]slog.Attr, 0, 10)
			attrs = append(attrs, slog.String("method", clip(r.Method)), slog.String("path", clip(r.URL.Path)))
			if a.key != "" {
				attrs = append(attrs, slog.String("key", a.key))
			}
			attrs = append(attrs, slog.Int("status", sw.status()), slog.Int64("bytes", sw.bytes),
				slog.String("duration", time.Since(start).Round(time.Microsecond).String()))
			switch {
			case a.decided && a.decision.Admitted:
				attrs = append(attrs, slog.String("limit", "admitted"))
			case a.decided:
				attrs = append(attrs, slog.String("limit", "refused"), slog.String("budget", a.decision.Budget),
					slog.String("dimension", a.decision.Dimension.String()))
			}
			log.LogAttrs(r.Context(), slog.LevelInfo, "gateway: request", attrs...)
		}()
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), accessKey{}, a)))
	})
}

// noteKey records, for the access log, the key the authentication stage
// found for the request. It does nothing without the access log.
func noteKey(ctx context.Context) {
	if a, ok := ctx.Value(accessKey{}).(*access); ok {
		p, _ := spenderhttp.PrincipalFrom(ctx)
		a.key = p.KeyID
	}
}

// noteDecision records, for the access log, what the limit stage
// decided: the stage's spenderhttp.WithDecisions hook.
func noteDecision(ctx context.Context, d spenderhttp.Decision) {
	if a, ok := ctx.Value(accessKey{}).(*access); ok {
		a.decided, a.decision = true, d
	}
}

func clip(s string) string {
	if len(s) > maxLoggedPath {
		return s[:maxLoggedPath] + "..."
	}
	return s
}
