package echo

import (
	"log/slog"
	"net/http"
	"strings"

	"github.com/rationhq/ration/internal/oaierror"
)

// Engine is the echo engine: an http.Handler that answers the OpenAI API
// subset listed in the package doc. Make one with New; it is safe for
// concurrent use and holds no per-request state.
type Engine struct {
	cfg config
}

// New returns an Engine configured by opts.
func New(opts ...Option) *Engine {
	return &Engine{cfg: newConfig(opts)}
}

// route is one endpoint: the method it answers and its handler.
type route struct {
	method string
	serve  func(*Engine, http.ResponseWriter, *http.Request)
}

// routes maps each path to its endpoint. It is built per call (a few
// pointers) so that the package keeps no mutable state.
func routes(path string) (route, bool) {
	switch path {
	case "/v1/chat/completions":
		return route{http.MethodPost, (*Engine).chat}, true
	case "/v1/completions":
		return route{http.MethodPost, (*Engine).completions}, true
	case "/v1/embeddings":
		return route{http.MethodPost, (*Engine).embeddings}, true
	case "/v1/tokenize", "/tokenize":
		return route{http.MethodPost, (*Engine).tokenize}, true
	case "/v1/models":
		return route{http.MethodGet, (*Engine).listModels}, true
	}
	return route{}, false
}

// ServeHTTP answers one request. Unknown paths get 404 and wrong methods
// 405, both in the OpenAI error shape.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if id, ok := strings.CutPrefix(path, "/v1/models/"); ok && id != "" {
		if r.Method != http.MethodGet {
			e.wrongMethod(w, r, http.MethodGet)
			return
		}
		e.getModel(w, id)
		return
	}
	rt, ok := routes(path)
	if !ok {
		oaierror.Write(w, http.StatusNotFound, oaierror.TypeInvalidRequest, "unknown_url", "",
			"Unknown request URL: "+r.Method+" "+path+". The echo engine serves /v1/chat/completions, "+
				"/v1/completions, /v1/embeddings, /v1/models and /v1/tokenize.")
		return
	}
	if r.Method != rt.method {
		e.wrongMethod(w, r, rt.method)
		return
	}
	rt.serve(e, w, r)
}

func (e *Engine) wrongMethod(w http.ResponseWriter, r *http.Request, allowed string) {
	w.Header().Set("Allow", allowed)
	oaierror.Write(w, http.StatusMethodNotAllowed, oaierror.TypeInvalidRequest, "method_not_allowed", "",
		r.Method+" is not allowed on "+r.URL.Path+"; use "+allowed+".")
}

// refuse logs and answers a client mistake.
func (e *Engine) refuse(w http.ResponseWriter, r *http.Request, err error) {
	e.cfg.logger.LogAttrs(r.Context(), slog.LevelDebug, "echo: refused", slog.String("path", r.URL.Path), slog.Any("err", err))
	writeFailure(w, err)
}
