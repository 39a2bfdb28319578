package sidecar

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"net/url"
	"strconv"
	"strings"

	"connectrpc.com/connect/v2"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The descriptor entry keys that pair a request's two calls (see
// docs/integrations.md): an entry ration_reserve=ID holds the request's
// reservation under ID; a later entry ration_settle=ID charges the
// descriptor's hits as the request's actual usage instead. They are taken
// out of the descriptor before it is matched against the configuration.
const (
	ReserveEntry = "ration_reserve"
	SettleEntry  = "ration_settle"
)

// Bounds on one ShouldRateLimit call.
const (
	maxDescriptors = 64
	maxEntries     = 64
	maxPairIDLen   = 256
)

// ShouldRateLimitProcedure is the Envoy rate limit service's method, as
// Envoy's rate limit filter calls it over gRPC.
const ShouldRateLimitProcedure = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// entry is one descriptor entry.
type entry struct{ key, value string }

// desc is one request descriptor, read and matched.
type desc struct {
	rule   *rule
	budget string // the ration key: domain and entries
	hits   int64  // its cost in hits, clamped to ration.MaxAmount
	refund bool   // is_negative_hits
	pair   string // the value of its ration_reserve or ration_settle entry, or ""
	settle bool   // the pair entry is ration_settle
}

// ShouldRateLimit answers Envoy's rate limit filter (see
// docs/integrations.md for what each configuration field does here). The
// descriptors that a rule limits are charged all or nothing: OVER_LIMIT
// charges none of them.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	cfg := s.cfg.Load()
	switch {
	case cfg == nil:
		return nil, connect.NewError(connect.CodeUnavailable, "sidecar: no rate limit configuration loaded (-ratelimit-config)")
	case req.GetDomain() == "":
		return nil, invalid("rate limit domain must not be empty")
	case len(req.GetDescriptors()) == 0:
		return nil, invalid("rate limit descriptor list must not be empty")
	case len(req.GetDescriptors()) > maxDescriptors:
		return nil, invalid("%d descriptors: at most %d", len(req.GetDescriptors()), maxDescriptors)
	}
	ds := make([]desc, len(req.GetDescriptors()))
	for i, d := range req.GetDescriptors() {
		if err := cfg.read(&ds[i], req, d); err != nil {
			return nil, err
		}
	}
	replaced(ds)

	res := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))}
	for i := range ds {
		res.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	if err := s.settleEnvoy(ctx, req.GetDomain(), ds, res); err != nil {
		return nil, err
	}
	if err := s.enforce(ctx, req.GetDomain(), ds, res); err != nil {
		return nil, err
	}
	s.m.decision(apiEnvoy, res.OverallCode.String())
	return res, nil
}

// read fills d from descriptor rd of req: its pairing entry, its rule (the
// descriptor's own limit override, or the configuration's), its budget
// key and its hits.
func (c *Config) read(d *desc, req *rlsv3.RateLimitRequest, rd *rlcommon.RateLimitDescriptor) error {
	if len(rd.GetEntries()) > maxEntries {
		return invalid("a descriptor has %d entries: at most %d", len(rd.GetEntries()), maxEntries)
	}
	entries := make([]entry, 0, len(rd.GetEntries()))
	for _, e := range rd.GetEntries() {
		switch e.GetKey() {
		case ReserveEntry, SettleEntry:
			if d.pair != "" {
				return invalid("a descriptor has more than one %s or %s entry", ReserveEntry, SettleEntry)
			}
			if v := e.GetValue(); v == "" || len(v) > maxPairIDLen {
				return invalid("%s value: want 1 to %d bytes", e.GetKey(), maxPairIDLen)
			}
			d.pair, d.settle = e.GetValue(), e.GetKey() == SettleEntry
			continue
		}
		entries = append(entries, entry{e.GetKey(), e.GetValue()})
	}
	d.hits = 1 // "If the value is not set in the message, a request increases the matched limit by 1."
	switch {
	case rd.GetHitsAddend() != nil:
		d.hits = int64(min(rd.GetHitsAddend().GetValue(), ration.MaxAmount))
	case req.GetHitsAddend() > 0:
		d.hits = int64(req.GetHitsAddend())
	}
	d.refund = rd.GetIsNegativeHits()
	var shared []string
	if o := rd.GetLimit(); o != nil && c.domains[req.GetDomain()] != nil {
		unit := rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit())
		if _, ok := unitWindow[unit]; !ok {
			return invalid("limit override unit %s: want second, minute, hour, day or week", unit)
		}
		d.rule = &rule{Unit: unit, RequestsPerUnit: o.GetRequestsPerUnit()}
	} else {
		d.rule, shared = c.match(req.GetDomain(), entries)
	}
	if d.rule != nil {
		d.budget = budgetKey(req.GetDomain(), entries, shared)
	}
	return nil
}

// budgetKey is the ration key of a descriptor: "rls/DOMAIN/k1=v1/k2=v2",
// each part query-escaped so that no two descriptors share one, with a
// share_threshold entry's wildcard pattern in place of its value. A key
// longer than ration.MaxKeyLen becomes "rls#" and its SHA-256, the same on
// every sidecar.
func budgetKey(domain string, entries []entry, shared []string) string {
	var b strings.Builder
	b.WriteString("rls/")
	b.WriteString(url.QueryEscape(domain))
	for i, e := range entries {
		v := e.value
		if shared != nil && shared[i] != "" {
			v = shared[i]
		}
		b.WriteByte('/')
		b.WriteString(url.QueryEscape(e.key))
		b.WriteByte('=')
		b.WriteString(url.QueryEscape(v))
	}
	if b.Len() <= ration.MaxKeyLen {
		return b.String()
	}
	sum := sha256.Sum256([]byte(b.String()))
	return "rls#" + hex.EncodeToString(sum[:])
}

// replaced drops the rules that another matched rule of the same request
// replaces (replaces: - name: ...), as envoyproxy/ratelimit does.
func replaced(ds []desc) {
	var names map[string]bool
	for _, d := range ds {
		if d.rule == nil {
			continue
		}
		for _, n := range d.rule.Replaces {
			if names == nil {
				names = map[string]bool{}
			}
			names[n] = true
		}
	}
	for i := range ds {
		if r := ds[i].rule; r != nil && r.Name != "" && names[r.Name] {
			ds[i].rule = nil
		}
	}
}

// limited reports whether d is charged to a bucket: a rule that is
// neither unlimited nor a deny rule.
func (d *desc) limited() bool { return d.rule != nil && !d.rule.Unlimited && !d.rule.deny() }

// settleEnvoy applies the stream-end descriptors (ration_settle=ID): each
// settles the part of the reservation held under ID for its budget with
// its hits as the usage (with is_negative_hits, the reserved cost minus
// its hits); one that matches nothing is charged after the fact, as debt
// when the budget is short. Parts of the reservation no descriptor
// mentions are settled at their reserved cost. These descriptors are
// never refused: Envoy does not wait for this answer.
func (s *Service) settleEnvoy(ctx context.Context, domain string, ds []desc, res *rlsv3.RateLimitResponse) error {
	taken := map[string]*held{}
	for i := range ds {
		d := &ds[i]
		if !d.settle || !d.limited() {
			continue
		}
		id := pairID(domain, d.pair)
		h, seen := taken[id]
		if !seen {
			h = s.holds.take(id)
			taken[id] = h
		}
		part := -1
		if h != nil {
			for j, k := range h.keys {
				if k == d.budget && h.parts[j] != nil {
					part = j
					break
				}
			}
		}
		res.Statuses[i].CurrentLimit = currentLimit(d.rule)
		if part >= 0 {
			usage := ration.Amount{Requests: d.hits}
			if d.refund {
				usage = h.costs[part].Sub(usage).Positive()
			}
			h.parts[part].Settle(usage)
			h.parts[part] = nil
			s.m.settlement(true)
			continue
		}
		s.m.settlement(false)
		if d.refund || d.hits == 0 {
			continue // a refund of nothing held would mint budget
		}
		r, _, err := s.lim.ReserveAt(ctx, d.budget, d.rule.Limits(), ration.Amount{}, ration.MaxWait)
		if err != nil {
			var rej *spender.RejectError
			if errors.As(err, &rej) {
				// The key owes more than an hour of its budget already:
				// the charge is dropped, and said so.
				s.log.Warn("sidecar: a stream-end charge was not recorded: the budget is in debt beyond an hour",
					"budget", d.budget, "hits", d.hits)
				continue
			}
			return statusCodeOf(err)
		}
		r.Settle(ration.Amount{Requests: d.hits})
	}
	for _, h := range taken {
		if h == nil {
			continue
		}
		for j, p := range h.parts {
			if p != nil {
				p.Settle(h.costs[j])
			}
		}
	}
	return nil
}

// pairID is the holds' id of an Envoy pair: its domain and ID, apart from
// the reserve/settle API's random ids (which contain no NUL).
func pairID(domain, id string) string { return "envoy\x00" + domain + "\x00" + id }

// charge is the request-path charge of one budget: the descriptors that
// name it (usually one) and their hits together.
type charge struct {
	spender.Charge
	rule  *rule
	descs []int
	pair  string
}

// enforce admits the request-path descriptors: those that a rule limits,
// all or nothing; a deny rule (requests_per_unit 0) refuses any hit; an
// unlimited rule answers OK; shadow_mode ones are charged when they fit
// and never refuse. An admitted request whose descriptors carry
// ration_reserve=ID is held under ID until its stream-end call.
func (s *Service) enforce(ctx context.Context, domain string, ds []desc, res *rlsv3.RateLimitResponse) error {
	var charges, shadows []charge
	denied := false
	for i := range ds {
		d := &ds[i]
		st := res.Statuses[i]
		switch {
		case d.settle || d.rule == nil:
		case d.rule.Unlimited:
			st.LimitRemaining = math.MaxUint32
		case d.refund:
			st.CurrentLimit = currentLimit(d.rule) // a refund outside a pair: nothing held to refund
		case d.rule.deny():
			st.CurrentLimit = currentLimit(d.rule)
			if d.hits > 0 && !d.rule.Shadow {
				st.Code, denied = rlsv3.RateLimitResponse_OVER_LIMIT, true
			}
		case d.rule.Shadow:
			shadows = addCharge(shadows, d, i)
		default:
			charges = addCharge(charges, d, i)
		}
	}
	if denied {
		res.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		return nil
	}
	if len(charges) > ration.MaxBudgets {
		return invalid("%d limited budgets in one request: at most %d", len(charges), ration.MaxBudgets)
	}
	if len(charges) > 0 {
		admitted, err := s.admit(ctx, domain, charges, res)
		if err != nil || !admitted {
			return err
		}
	}
	for _, c := range shadows {
		s.admitShadow(ctx, c, res)
	}
	return nil
}

// addCharge adds descriptor i to the charge of its budget.
func addCharge(cs []charge, d *desc, i int) []charge {
	for j := range cs {
		if cs[j].Key == d.budget {
			cs[j].Cost.Requests = min(cs[j].Cost.Requests+d.hits, ration.MaxAmount)
			cs[j].descs = append(cs[j].descs, i)
			if cs[j].pair == "" {
				cs[j].pair = d.pair
			}
			return cs
		}
	}
	return append(cs, charge{Charge: spender.Charge{Key: d.budget, Limits: d.rule.Limits(), Cost: ration.Amount{Requests: d.hits}},
		rule: d.rule, descs: []int{i}, pair: d.pair})
}

// admit reserves charges all or nothing and fills their statuses. It
// reports whether they were admitted.
func (s *Service) admit(ctx context.Context, domain string, charges []charge, res *rlsv3.RateLimitResponse) (bool, error) {
	pairs := map[string][]int{} // ID -> the charges held under it
	for j, c := range charges {
		if c.pair != "" {
			pairs[c.pair] = append(pairs[c.pair], j)
		}
	}
	for claimed := range len(pairs) {
		if err := s.holds.claim(); err != nil {
			for range claimed {
				s.holds.release()
			}
			return false, errFull(s.holds.max)
		}
	}
	sc := make([]spender.Charge, len(charges))
	for j, c := range charges {
		sc[j] = c.Charge
	}
	rs, err := s.lim.ReserveAll(ctx, sc)
	if err != nil {
		for range pairs {
			s.holds.release()
		}
		var rej *spender.RejectError
		if !errors.As(err, &rej) {
			return false, statusCodeOf(err)
		}
		s.refuse(charges, rej, res)
		return false, nil
	}
	for j, c := range charges {
		st := rs.Part(j).Status()
		for _, i := range c.descs {
			res.Statuses[i].CurrentLimit = currentLimit(c.rule)
			res.Statuses[i].LimitRemaining = clampUint32(st.RemainingRequests)
			res.Statuses[i].DurationUntilReset = durationpb.New(st.ResetRequests)
		}
	}
	for id, js := range pairs {
		h := &held{}
		for _, j := range js {
			h.parts = append(h.parts, rs.Part(j))
			h.costs = append(h.costs, charges[j].Cost)
			h.keys = append(h.keys, charges[j].Key)
		}
		s.holds.put(pairID(domain, id), h, 0)
	}
	return true, nil
}

// refuse fills the statuses of a refused request: OVER_LIMIT on the budget
// that refused, with the wait after which the same request is admitted
// (none when it can never fit), and Retry-After for the client.
func (s *Service) refuse(charges []charge, rej *spender.RejectError, res *rlsv3.RateLimitResponse) {
	res.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	for j, c := range charges {
		if c.Key != rej.Key && !(rej.Key == "" && j == 0) {
			continue
		}
		for _, i := range c.descs {
			st := res.Statuses[i]
			st.Code, st.CurrentLimit = rlsv3.RateLimitResponse_OVER_LIMIT, currentLimit(c.rule)
			st.LimitRemaining = clampUint32(rej.Status.RemainingRequests)
			if !rej.Oversize {
				st.DurationUntilReset = durationpb.New(rej.RetryAfter)
			}
		}
	}
	if !rej.Oversize {
		res.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: "retry-after", Value: strconv.Itoa(spender.RetryAfterSeconds(rej.RetryAfter))}}
	}
}

// admitShadow charges a shadow_mode budget when it fits; when it does not,
// it is answered OK all the same and counted.
func (s *Service) admitShadow(ctx context.Context, c charge, res *rlsv3.RateLimitResponse) {
	rs, err := s.lim.ReserveAll(ctx, []spender.Charge{c.Charge})
	var st spender.Status
	var rej *spender.RejectError
	switch {
	case err == nil:
		st = rs.Status()
	case errors.As(err, &rej):
		st = rej.Status
		s.m.shadowOverLimit()
	default:
		s.log.Warn("sidecar: a shadow_mode budget could not be charged", "budget", c.Key, "err", err)
		return
	}
	for _, i := range c.descs {
		res.Statuses[i].CurrentLimit = currentLimit(c.rule)
		res.Statuses[i].LimitRemaining = clampUint32(st.RemainingRequests)
		res.Statuses[i].DurationUntilReset = durationpb.New(st.ResetRequests)
	}
}

func currentLimit(r *rule) *rlsv3.RateLimitResponse_RateLimit {
	return &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: r.RequestsPerUnit, Unit: r.Unit, Name: r.Name}
}

func clampUint32(v int64) uint32 { return uint32(min(max(v, 0), math.MaxUint32)) }
