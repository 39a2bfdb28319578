package spender

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rationhq/ration"
)

// Metrics are a Limiter's Prometheus metrics. Make them with NewMetrics,
// which registers them on the registerer the caller chooses (there is no
// global registry), and pass them with WithMetrics. One Metrics may serve
// only one Limiter. A nil *Metrics records nothing, and so does a standalone
// Limiter: the metrics describe the leased mode.
//
// Names, all prefixed ration_spender_:
//
//	admitted_total{path}           admissions, one per budget a request is
//	                               charged to (ReserveAll: one per charge);
//	                               path is local (from a lease or the
//	                               standalone buckets), slow (after an
//	                               allocator call), fallback, or ahead (wait
//	                               mode via the allocator)
//	rejected_total{reason}         rejections, one per refused request (its
//	                               budgets together): rate_limited, oversize,
//	                               fail_closed
//	lease_calls_total{method,result}  allocator calls: Acquire, ReserveAhead,
//	                               Release; result ok or error (each attempt)
//	lease_call_seconds{method}     allocator call latency (successful attempts)
//	keys_held                      keys holding a lease, a share, admitted requests not yet settled or something to report
//	fallback                       1 while the allocator does not serve this Limiter (it admits by its fallback policy)
//	returned_total{dimension}      requests and tokens the allocator credited back
//	usage_ratio                    actual tokens over reserved tokens at Settle:
//	                               how much the estimate (prompt + max_tokens)
//	                               over-reserves (declaring 4096 and using 300
//	                               reserves about thirteen times the spend)
//	share_accrued_total{dimension} requests and tokens refill shares added to
//	                               leases (admitted without an allocator call)
//	share_rate{dimension}          the refill rate this Limiter holds in shares,
//	                               per minute, summed over keys (as of the last
//	                               maintenance scan); 0 without shares
//
// Recorded by the LeaseSource of DialAllocator when it is given the same
// Metrics with WithSourceMetrics:
//
//	leader_redirects_total{result}  NOT_LEADER answers that named a leader:
//	                               followed (the attempt was sent there),
//	                               outside (the URL is not a configured
//	                               member; not followed), limit (the attempt
//	                               had been redirected the most times already)
//	allocator_leader{member}       1 for the configured member that answered
//	                               last (the leader, for a cluster), 0 for the
//	                               others; all 0 before any answer
type Metrics struct {
	admittedLocal, admittedSlow, admittedFallback, admittedAhead prometheus.Counter
	rejectedLimited, rejectedOversize, rejectedClosed            prometheus.Counter
	calls                                                        *prometheus.CounterVec
	callSeconds                                                  *prometheus.HistogramVec
	keysHeld, fallback                                           prometheus.Gauge
	returnedRequests, returnedTokens                             prometheus.Counter
	usageRatio                                                   prometheus.Histogram
	accruedRequests, accruedTokens                               prometheus.Counter
	shareRequests, shareTokens                                   prometheus.Gauge
	redirects                                                    *prometheus.CounterVec
	leader                                                       *prometheus.GaugeVec
}

// NewMetrics creates the Limiter metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	const ns, sub = "ration", "spender"
	admitted := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "admitted_total",
		Help: "Admissions, one per budget a request is charged to, by path: local, slow, fallback, ahead."}, []string{"path"})
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rejected_total",
		Help: "Requests rejected, by reason: rate_limited, oversize, fail_closed."}, []string{"reason"})
	returned := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "returned_total",
		Help: "Budget the allocator credited back, by dimension: requests, tokens."}, []string{"dimension"})
	accrued := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "share_accrued_total",
		Help: "Budget refill shares added to leases, by dimension: requests, tokens."}, []string{"dimension"})
	shareRate := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "share_rate",
		Help: "Refill rate held in shares, per minute, summed over keys, by dimension: requests, tokens."}, []string{"dimension"})
	m := &Metrics{
		admittedLocal:    admitted.WithLabelValues("local"),
		admittedSlow:     admitted.WithLabelValues("slow"),
		admittedFallback: admitted.WithLabelValues("fallback"),
		admittedAhead:    admitted.WithLabelValues("ahead"),
		rejectedLimited:  rejected.WithLabelValues("rate_limited"),
		rejectedOversize: rejected.WithLabelValues("oversize"),
		rejectedClosed:   rejected.WithLabelValues("fail_closed"),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "lease_calls_total",
			Help: "Allocator call attempts, by method and result (ok, error)."}, []string{"method", "result"}),
		callSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "lease_call_seconds",
			Help:    "Latency of successful allocator calls, in seconds.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}, []string{"method"}),
		keysHeld: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "keys_held",
			Help: "Keys holding a lease, a share, admitted requests not yet settled or something to report; 0 a TTL after the last request."}),
		fallback: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "fallback",
			Help: "1 while the allocator does not serve this Limiter (unreachable, refusing its calls or its credential) and the fallback policy applies."}),
		returnedRequests: returned.WithLabelValues("requests"),
		returnedTokens:   returned.WithLabelValues("tokens"),
		accruedRequests:  accrued.WithLabelValues("requests"),
		accruedTokens:    accrued.WithLabelValues("tokens"),
		shareRequests:    shareRate.WithLabelValues("requests"),
		shareTokens:      shareRate.WithLabelValues("tokens"),
		redirects: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "leader_redirects_total",
			Help: "NOT_LEADER answers naming a leader, by result: followed, outside (not a configured member), limit (too many redirects in one attempt)."}, []string{"result"}),
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "allocator_leader",
			Help: "1 for the configured allocator member that answered last (the cluster's leader), 0 for the others."}, []string{"member"}),
		usageRatio: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "usage_ratio",
			Help:    "Actual tokens over reserved tokens at Settle (1 = the estimate was exact).",
			Buckets: []float64{0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1, 1.1, 1.5, 2, 5}}),
	}
	for _, c := range []prometheus.Collector{admitted, rejected, returned, accrued, shareRate, m.calls, m.callSeconds, m.keysHeld, m.fallback, m.usageRatio, m.redirects, m.leader} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("spender: registering metrics: %w", err)
		}
	}
	return m, nil
}

// admitPath says where an admission came from, for admitted_total.
type admitPath uint8

const (
	pathLocal admitPath = iota
	pathSlow
	pathFallback
	pathAhead
)

func (m *Metrics) admit(p admitPath) {
	if m == nil {
		return
	}
	switch p {
	case pathLocal:
		m.admittedLocal.Inc()
	case pathSlow:
		m.admittedSlow.Inc()
	case pathFallback:
		m.admittedFallback.Inc()
	case pathAhead:
		m.admittedAhead.Inc()
	}
}

func (m *Metrics) reject(err *RejectError) {
	if m == nil {
		return
	}
	if err.Oversize {
		m.rejectedOversize.Inc()
	} else {
		m.rejectedLimited.Inc()
	}
}

func (m *Metrics) usage(reserved, actual int64) {
	if m != nil && reserved > 0 {
		m.usageRatio.Observe(float64(actual) / float64(reserved))
	}
}

// Path says where an admission came from.
type Path string

const (
	PathStandalone Path = "standalone" // a standalone Limiter's own buckets
	PathLease      Path = "local"      // a valid lease, no allocator call
	PathSlow       Path = "slow"       // a lease refreshed while the request waited
	PathFallback   Path = "fallback"   // the fallback policy, the allocator unreachable
	PathAhead      Path = "ahead"      // wait mode, reserved at the allocator
	PathUnlimited  Path = "unlimited"  // no limited dimension
)

// AdmissionPath reports where r was admitted from: a simulator or a test
// that counts fallback admissions apart from granted ones reads it here.
func AdmissionPath(r Reservation) Path {
	switch r := r.(type) {
	case *reservation:
		return PathStandalone
	case *leasedReservation:
		switch r.path {
		case pathSlow:
			return PathSlow
		case pathFallback:
			return PathFallback
		case pathAhead:
			return PathAhead
		}
		return PathLease
	}
	return PathUnlimited
}

func (m *Metrics) returned(a ration.Amount) {
	if m != nil {
		m.returnedRequests.Add(float64(a.Requests))
		m.returnedTokens.Add(float64(a.Tokens))
	}
}

func (m *Metrics) shareAccrued(a ration.Amount) {
	if m != nil {
		m.accruedRequests.Add(float64(a.Requests))
		m.accruedTokens.Add(float64(a.Tokens))
	}
}

func (m *Metrics) setShareRate(perMinute [2]float64) {
	if m != nil {
		m.shareRequests.Set(perMinute[0])
		m.shareTokens.Set(perMinute[1])
	}
}

func (m *Metrics) setFallback(on bool) {
	if m != nil {
		v := 0.0
		if on {
			v = 1
		}
		m.fallback.Set(v)
	}
}

func (m *Metrics) setKeysHeld(n int) {
	if m != nil {
		m.keysHeld.Set(float64(n))
	}
}

func (m *Metrics) failClosed() {
	if m != nil {
		m.rejectedClosed.Inc()
	}
}

// call counts one attempt of an allocator call; a successful one's
// latency is observed.
func (m *Metrics) call(method string, err error, d time.Duration) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.calls.WithLabelValues(method, result).Inc()
	if err == nil {
		m.callSeconds.WithLabelValues(method).Observe(d.Seconds())
	}
}

// redirectResult is what became of a NOT_LEADER answer naming a leader,
// for leader_redirects_total.
type redirectResult string

const (
	redirectFollowed redirectResult = "followed"
	redirectOutside  redirectResult = "outside"
	redirectLimit    redirectResult = "limit"
)

func (m *Metrics) redirect(r redirectResult) {
	if m != nil {
		m.redirects.WithLabelValues(string(r)).Inc()
	}
}

// members shows every configured allocator member in allocator_leader, at
// 0 until one answers.
func (m *Metrics) members(urls []string) {
	if m != nil {
		for _, u := range urls {
			m.leader.WithLabelValues(u).Set(0)
		}
	}
}

// setLeader moves allocator_leader's 1 from prev ("" for none) to leader.
func (m *Metrics) setLeader(leader, prev string) {
	if m == nil {
		return
	}
	if prev != "" {
		m.leader.WithLabelValues(prev).Set(0)
	}
	m.leader.WithLabelValues(leader).Set(1)
}
