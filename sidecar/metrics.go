package sidecar

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The APIs, as the metrics' api label names them.
const (
	apiReserve = "reserve"
	apiEnvoy   = "envoy"
)

// Metrics are the Service's Prometheus metrics (the Limiter's own are
// spender.NewMetrics'):
//
//	ration_sidecar_decisions_total{api,decision}  requests decided: api reserve or
//	                                              envoy; decision DECISION_ADMITTED,
//	                                              DECISION_RATE_LIMITED, DECISION_TOO_LARGE
//	                                              (reserve), OK, OVER_LIMIT (envoy)
//	ration_sidecar_open_reservations              reservations held, awaiting Settle or Cancel
//	ration_sidecar_expired_total                  held past the hold time and settled at
//	                                              their reserved cost
//	ration_sidecar_envoy_settlements_total{matched} stream-end charges (ration_settle):
//	                                              matched a held reservation (true) or
//	                                              charged after the fact (false)
//	ration_sidecar_envoy_shadow_over_limit_total  shadow_mode descriptors that would have
//	                                              been refused
//
// A nil *Metrics records nothing.
type Metrics struct {
	reg         prometheus.Registerer
	decisions   *prometheus.CounterVec
	expired     prometheus.Counter
	settlements *prometheus.CounterVec
	shadowOver  prometheus.Counter
}

// NewMetrics creates the Service's metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	const ns, sub = "ration", "sidecar"
	m := &Metrics{
		reg: reg,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Requests decided, by api (reserve, envoy) and decision."}, []string{"api", "decision"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "expired_total",
			Help: "Reservations neither settled nor cancelled within the hold time, settled at their reserved cost."}),
		settlements: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "envoy_settlements_total",
			Help: "Envoy stream-end charges (ration_settle), by matched: true (a held reservation), false (charged after the fact)."}, []string{"matched"}),
		shadowOver: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "envoy_shadow_over_limit_total",
			Help: "shadow_mode descriptors that would have been refused (answered OK)."}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.expired, m.settlements, m.shadowOver} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("sidecar: registering metrics: %w", err)
		}
	}
	return m, nil
}

// watchOpen registers the open reservations gauge, read from open.
func (m *Metrics) watchOpen(open func() int) error {
	if m == nil {
		return nil
	}
	err := m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "ration", Subsystem: "sidecar", Name: "open_reservations",
		Help: "Reservations held, awaiting Settle or Cancel."}, func() float64 { return float64(open()) }))
	if err != nil {
		return fmt.Errorf("sidecar: registering metrics: %w", err)
	}
	return nil
}

func (m *Metrics) decision(api, d string) {
	if m != nil {
		m.decisions.WithLabelValues(api, d).Inc()
	}
}

func (m *Metrics) expire() {
	if m != nil {
		m.expired.Inc()
	}
}

func (m *Metrics) settlement(matched bool) {
	if m != nil {
		m.settlements.WithLabelValues(fmt.Sprint(matched)).Inc()
	}
}

func (m *Metrics) shadowOverLimit() {
	if m != nil {
		m.shadowOver.Inc()
	}
}
