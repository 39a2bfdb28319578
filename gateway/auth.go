package gateway

import (
	"log/slog"
	"net/http"
	"strings"

	"github.com/rationhq/ration/internal/oaierror"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// Authenticate returns the authentication stage: it takes the API key
// from "Authorization: Bearer <key>", looks it up in keys.Current() (read
// once per request: a reload swaps the keys between requests, never
// during one), and puts the key's spenderhttp.Principal, its limits
// included, on the request context for the limit stage.
// A missing header, another scheme or an unknown key is answered 401 in
// the OpenAI error shape (type invalid_request_error, code
// invalid_api_key when a key was given), with WWW-Authenticate: Bearer;
// the presented key is never echoed or logged. onFail, if not nil, is
// called with "missing" or "unknown" for each refusal (for metrics).
func Authenticate(keys KeySource, logger *slog.Logger, onFail func(reason string)) func(http.Handler) http.Handler {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if onFail == nil {
		onFail = func(string) {}
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			secret, ok := bearer(r.Header.Get("Authorization"))
			if !ok {
				onFail("missing")
				w.Header().Set("WWW-Authenticate", `Bearer realm="ration"`)
				oaierror.Write(w, http.StatusUnauthorized, oaierror.TypeInvalidRequest, "", "",
					"You didn't provide an API key. You need to provide your API key in an Authorization header "+
						"using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
				return
			}
			p, ok := keys.Current().Principal(secret)
			if !ok {
				onFail("unknown")
				logger.LogAttrs(r.Context(), slog.LevelInfo, "gateway: unknown API key",
					slog.String("path", r.URL.Path), slog.Int("key_len", len(secret)))
				w.Header().Set("WWW-Authenticate", `Bearer realm="ration", error="invalid_token"`)
				oaierror.Write(w, http.StatusUnauthorized, oaierror.TypeInvalidRequest, "invalid_api_key", "",
					"Incorrect API key provided. Check the key, or ask the gateway's operator for one.")
				return
			}
			next.ServeHTTP(w, r.WithContext(spenderhttp.WithPrincipal(r.Context(), p)))
		})
	}
}

// bearer returns the token of an "Authorization: Bearer <token>" value
// (the scheme matched case-insensitively) and reports whether there is a
// non-empty one.
func bearer(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
