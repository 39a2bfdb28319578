package allocator

import (
	"time"

	"connectrpc.com/connect/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
)

// Metrics are the allocator's Prometheus metrics, registered on a
// caller-supplied registry (no globals). A nil *Metrics records nothing.
//
//	ration_allocator_calls_total{method,code}             calls answered ("ok" or a connect code)
//	ration_allocator_call_duration_seconds{method}        call latency, seconds, including the commit
//	ration_allocator_granted_total{dimension}             units granted or reserved (requests, tokens)
//	ration_allocator_returned_total{dimension}            units credited back
//	ration_allocator_debt_total{dimension}                overrun units charged
//	ration_allocator_rejections_total{reason}             keys not granted: not_covered, too_large, too_late
//	ration_allocator_commit_duration_seconds              bbolt group commit latency, seconds
//	ration_allocator_commit_errors_total                  failed commits
//	ration_allocator_active_keys                          keys with state in memory
//	ration_allocator_active_spenders                      spender incarnations holding a lease
//	ration_allocator_holdings                             (spender, key) leases not yet expired
type Metrics struct {
	calls      *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	granted    *prometheus.CounterVec
	returned   *prometheus.CounterVec
	debt       *prometheus.CounterVec
	rejections *prometheus.CounterVec
	commit     prometheus.Histogram
	commitErrs prometheus.Counter
	keyGrants  *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_allocator_calls_total", Help: "Lease calls answered, by method and result code.",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ration_allocator_call_duration_seconds", Help: "Lease call latency in seconds, commit included.",
			Buckets: prometheus.ExponentialBuckets(20e-6, 2, 14),
		}, []string{"method"}),
		granted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_allocator_granted_total", Help: "Units granted or reserved, by dimension.",
		}, []string{"dimension"}),
		returned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_allocator_returned_total", Help: "Units credited back by returns, by dimension.",
		}, []string{"dimension"}),
		debt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_allocator_debt_total", Help: "Overrun units charged, by dimension.",
		}, []string{"dimension"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_allocator_rejections_total", Help: "Keys in a call that got nothing, by reason.",
		}, []string{"reason"}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ration_allocator_commit_duration_seconds", Help: "bbolt group commit latency in seconds (wait for the batch included).",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 14),
		}),
		commitErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_allocator_commit_errors_total", Help: "Failed bbolt commits.",
		}),
		keyGrants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_allocator_key_grants_total", Help: "Keys answered in Acquire and ReserveAhead calls (the allocator's per-key work), by method.",
		}, []string{"method"}),
	}
	for _, c := range []prometheus.Collector{m.calls, m.duration, m.granted, m.returned, m.debt, m.rejections, m.commit, m.commitErrs, m.keyGrants} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ObserveCommit records one commit; pass it to WithCommitObserver.
func (m *Metrics) ObserveCommit(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.commit.Observe(d.Seconds())
	if err != nil {
		m.commitErrs.Inc()
	}
}

// RegisterLedger exports l's gauges (active keys, spenders, holdings) on
// reg; they are computed at scrape time.
func RegisterLedger(reg prometheus.Registerer, l *Ledger) error {
	return reg.Register(&ledgerCollector{l: l,
		keys:     prometheus.NewDesc("ration_allocator_active_keys", "Keys with state in memory.", nil, nil),
		spenders: prometheus.NewDesc("ration_allocator_active_spenders", "Spender incarnations holding an unexpired lease.", nil, nil),
		holdings: prometheus.NewDesc("ration_allocator_holdings", "Unexpired (spender, key) leases.", nil, nil),
		shared:   prometheus.NewDesc("ration_allocator_shared_holdings", "Unexpired (spender, key) leases with a refill share.", nil, nil),
	})
}

type ledgerCollector struct {
	l                                *Ledger
	keys, spenders, holdings, shared *prometheus.Desc
}

func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.keys
	ch <- c.spenders
	ch <- c.holdings
	ch <- c.shared
}

func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.l.Stats()
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(c.spenders, prometheus.GaugeValue, float64(st.Spenders))
	ch <- prometheus.MustNewConstMetric(c.holdings, prometheus.GaugeValue, float64(st.Holdings))
	ch <- prometheus.MustNewConstMetric(c.shared, prometheus.GaugeValue, float64(st.Shared))
}

func (m *Metrics) call(method string, start time.Time, err *connect.Error) {
	if m == nil {
		return
	}
	code := "ok"
	if err != nil {
		code = err.Code().String()
	}
	m.calls.WithLabelValues(method, code).Inc()
	m.duration.WithLabelValues(method).Observe(time.Since(start).Seconds())
}

func (m *Metrics) add(v *prometheus.CounterVec, a ration.Amount) {
	if a.Requests > 0 {
		v.WithLabelValues("requests").Add(float64(a.Requests))
	}
	if a.Tokens > 0 {
		v.WithLabelValues("tokens").Add(float64(a.Tokens))
	}
}

func (m *Metrics) reject(s ledger.Status) {
	if s != ledger.StatusOK {
		m.rejections.WithLabelValues(s.String()).Inc()
	}
}

func (m *Metrics) acquired(keys []ledger.AcquireKey, r *ledger.AcquireReply) {
	if m == nil {
		return
	}
	var g, ret, debt ration.Amount
	for i := range r.Keys {
		x := &r.Keys[i]
		g.Requests, g.Tokens = g.Requests+x.Granted.Requests, g.Tokens+x.Granted.Tokens
		ret.Requests, ret.Tokens = ret.Requests+x.Returned.Requests, ret.Tokens+x.Returned.Tokens
		debt.Requests, debt.Tokens = debt.Requests+keys[i].Debt.Requests, debt.Tokens+keys[i].Debt.Tokens
		m.reject(x.Status)
	}
	m.add(m.granted, g)
	m.add(m.returned, ret)
	m.add(m.debt, debt)
	m.keyGrants.WithLabelValues("Acquire").Add(float64(len(r.Keys)))
}

func (m *Metrics) reserved(keys []ledger.ReserveKey, r *ledger.ReserveReply) {
	if m == nil {
		return
	}
	var g ration.Amount
	for i := range r.Keys {
		if r.Keys[i].Status == ledger.StatusOK {
			g.Requests, g.Tokens = g.Requests+keys[i].Cost.Requests, g.Tokens+keys[i].Cost.Tokens
		}
		m.reject(r.Keys[i].Status)
	}
	m.add(m.granted, g)
	m.keyGrants.WithLabelValues("ReserveAhead").Add(float64(len(r.Keys)))
}

func (m *Metrics) released(r *ledger.ReleaseReply) {
	if m == nil {
		return
	}
	var ret ration.Amount
	for _, a := range r.Returned {
		ret.Requests, ret.Tokens = ret.Requests+a.Requests, ret.Tokens+a.Tokens
	}
	m.add(m.returned, ret)
}
