package gateway

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are one instance's HTTP metrics, prefixed ration_gateway_:
//
//	requests_total{route,code}        answered requests
//	request_seconds{route}            time to the end of the answer
//	in_flight                         requests being answered
//	auth_failures_total{reason}       401s: missing or unknown key
//	upstream_errors_total             upstream unreachable (502)
type metrics struct {
	requests     *prometheus.CounterVec
	seconds      *prometheus.HistogramVec
	inFlight     prometheus.Gauge
	authFailures *prometheus.CounterVec
	upstreamErrs prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "ration", "gateway"
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests answered, by route and status code."}, []string{"route", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "request_seconds",
			Help:    "Time from the request to the end of the answer, in seconds (streams included).",
			Buckets: prometheus.ExponentialBuckets(100e-6, 4, 10)}, []string{"route"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "in_flight",
			Help: "Requests being answered."}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "auth_failures_total",
			Help: "Requests refused 401, by reason: missing, unknown."}, []string{"reason"}),
		upstreamErrs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "upstream_errors_total",
			Help: "Requests the upstream engine did not answer (502)."}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.seconds, m.inFlight, m.authFailures, m.upstreamErrs} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("gateway: registering metrics: %w", err)
		}
	}
	return m, nil
}

// routeLabel bounds the route label to the OpenAI paths the gateway knows.
func routeLabel(path string) string {
	switch {
	case path == "/v1/chat/completions", path == "/v1/completions", path == "/v1/embeddings",
		path == "/v1/responses", path == "/v1/tokenize":
		return path
	case path == "/v1/models", strings.HasPrefix(path, "/v1/models/"):
		return "/v1/models"
	}
	return "other"
}

// instrument counts and times every request through next.
func (m *metrics) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		m.inFlight.Inc()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			m.inFlight.Dec()
			route := routeLabel(r.URL.Path)
			m.requests.WithLabelValues(route, strconv.Itoa(sw.status())).Inc()
			m.seconds.WithLabelValues(route).Observe(time.Since(start).Seconds())
		}()
		next.ServeHTTP(sw, r)
	})
}

// statusWriter remembers the status code and counts the body's bytes.
// Unwrap lets http.ResponseController reach the real writer, so flushes
// go through.
type statusWriter struct {
	http.ResponseWriter
	code  int
	bytes int64
}

// status is the status written, 200 if none was.
func (s *statusWriter) status() int {
	if s.code == 0 {
		return http.StatusOK
	}
	return s.code
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 && code >= 200 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	s.bytes += int64(n)
	return n, err
}

// Unwrap returns the wrapped ResponseWriter.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
