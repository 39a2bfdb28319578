package spender

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rationhq/ration"
)

// Cluster is one allocator cluster a Router spreads keys over: its name,
// which must be the same on every gateway (keys are routed by it), and
// the leased Limiter that spends its leases, with its own LeaseSource,
// spender session and sequence numbers.
type Cluster struct {
	Name    string // 1 or more bytes, no zero byte; unique among a Router's clusters
	Limiter *Limiter
}

// Router spreads keys over several allocator clusters, each an independent
// allocator with its own ledger: every key's budget lives on exactly one
// cluster, chosen by rendezvous hashing of the key over the cluster names
// (Route), so every gateway sends a key to the same cluster and keys and
// their load spread evenly. Adding a cluster moves about 1/(n+1) of the
// keys, all of them to the new cluster; removing one moves only its keys.
//
// Each cluster has its own leased Limiter, so losing a cluster affects
// only the keys routed to it: they follow their Limiter's fallback policy
// while the other clusters' keys keep refreshing their leases. (One
// LeaseSource that split each call over the clusters would instead fail
// every key's call when one cluster fails.)
//
// Router has the Limiter's admission surface (Reserve, ReserveAt,
// ReserveAll, Ready, Flush, Close), so the HTTP stage
// (spenderhttp.Middleware) and the gateway take it in place of a Limiter.
// It is safe for concurrent use; its cluster list is fixed at NewRouter.
//
// ReserveAll over budgets routed to different clusters is all or nothing,
// but not atomic: each cluster's Limiter decides its budgets at once (in
// parallel), and when one refuses, the budgets the others admitted are
// cancelled (Reservation.Cancel returns the whole cost). Until then they
// are held, so a request refused meanwhile on another cluster's budget
// may see them as spent. Their admissions appear in those Limiters'
// admitted_total metrics although the request was refused.
type Router struct {
	names    []string
	prefixes []uint64 // namePrefix of each name
	lims     []*Limiter
}

// NewRouter returns a Router over clusters. It refuses, with an error
// wrapping ErrInvalidOption, no clusters, an empty name or one with a zero
// byte, a name given twice, a nil Limiter, or one Limiter given twice.
// The Router does not own the Limiters until Close: closing it closes
// them all.
func NewRouter(clusters ...Cluster) (*Router, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: NewRouter: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
	}
	if len(clusters) == 0 {
		return nil, bad("no clusters")
	}
	r := &Router{}
	for i, c := range clusters {
		switch {
		case c.Name == "":
			return nil, bad("cluster %d has an empty name", i)
		case strings.IndexByte(c.Name, 0) >= 0:
			return nil, bad("cluster %d's name %q holds a zero byte", i, c.Name)
		case c.Limiter == nil:
			return nil, bad("cluster %q has no Limiter", c.Name)
		}
		for j := range i {
			if clusters[j].Name == c.Name {
				return nil, bad("clusters %d and %d are both named %q", j, i, c.Name)
			}
			if clusters[j].Limiter == c.Limiter {
				return nil, bad("clusters %q and %q share one Limiter", clusters[j].Name, c.Name)
			}
		}
		r.names = append(r.names, c.Name)
		r.prefixes = append(r.prefixes, namePrefix(c.Name))
		r.lims = append(r.lims, c.Limiter)
	}
	return r, nil
}

// Cluster returns the name of the cluster key is routed to.
func (r *Router) Cluster(key string) string { return r.names[r.route(key)] }

// route is the index of key's cluster.
func (r *Router) route(key string) int { return highest(r.prefixes, r.names, key) }

// Reserve is Limiter.Reserve on key's cluster.
func (r *Router) Reserve(ctx context.Context, key string, lim ration.Limits, c ration.Amount) (Reservation, error) {
	return r.lims[r.route(key)].Reserve(ctx, key, lim, c)
}

// ReserveAt is Limiter.ReserveAt on key's cluster.
func (r *Router) ReserveAt(ctx context.Context, key string, lim ration.Limits, c ration.Amount, maxWait time.Duration) (Reservation, time.Time, error) {
	return r.lims[r.route(key)].ReserveAt(ctx, key, lim, c, maxWait)
}

// ReserveAll is Limiter.ReserveAll over budgets that may live on several
// clusters: every charge's cost, or none. Charges routed to one cluster
// go to its Limiter's ReserveAll as they are. Otherwise each cluster's
// Limiter decides its charges, all in parallel; when any refuses, every
// other cluster's reservations are cancelled and the refusal returned: an
// oversize one first, else the one with the longest RetryAfter, as a
// single Limiter chooses. Bad input (the charges, or any charge's limits)
// is refused before any cluster is asked, and changes nothing.
func (r *Router) ReserveAll(ctx context.Context, charges []Charge) (*Reservations, error) {
	if err := checkCharges(charges); err != nil {
		return nil, err
	}
	var to [ration.MaxBudgets]int
	one := true
	for i, c := range charges {
		if to[i] = r.route(c.Key); to[i] != to[0] {
			one = false
		}
	}
	if one {
		return r.lims[to[0]].ReserveAll(ctx, charges)
	}
	for i, c := range charges {
		if err := c.Limits.Validate(); err != nil {
			return nil, fmt.Errorf("charge %d: %w", i, err)
		}
	}
	groups := groupByCluster(charges, to[:len(charges)])
	var wg sync.WaitGroup
	for gi := range groups {
		g := &groups[gi]
		wg.Go(func() { g.rs, g.err = r.lims[g.cluster].ReserveAll(ctx, g.charges) })
	}
	wg.Wait()
	var refusal error
	for gi := range groups {
		if g := &groups[gi]; g.err != nil && worseRefusal(g.err, refusal) {
			refusal = g.err
		}
	}
	if refusal != nil {
		for _, g := range groups {
			if g.rs != nil {
				g.rs.Cancel()
			}
		}
		return nil, refusal
	}
	rs := newReservations(len(charges))
	for _, g := range groups {
		for j, i := range g.idx {
			rs.parts[i] = g.rs.parts[j]
		}
	}
	return rs, nil
}

// clusterCharges is the charges of one ReserveAll routed to one cluster.
type clusterCharges struct {
	cluster int
	idx     []int // each charge's index in the ReserveAll
	charges []Charge
	rs      *Reservations // the cluster's answer
	err     error
}

// groupByCluster splits charges by cluster (to[i] is charge i's), the
// groups in the order their first charge comes.
func groupByCluster(charges []Charge, to []int) []clusterCharges {
	var groups []clusterCharges
next:
	for i, c := range charges {
		for gi := range groups {
			if g := &groups[gi]; g.cluster == to[i] {
				g.idx, g.charges = append(g.idx, i), append(g.charges, c)
				continue next
			}
		}
		groups = append(groups, clusterCharges{cluster: to[i], idx: []int{i}, charges: []Charge{c}})
	}
	return groups
}

// worseRefusal reports whether err should be returned rather than cur
// (nil: none yet): an error that is not a *RejectError (a key the
// allocator rejected, a closed Limiter, the context) first, then an
// oversize refusal, then the longest RetryAfter.
func worseRefusal(err, cur error) bool {
	if cur == nil {
		return true
	}
	var a, b *RejectError
	ar, br := errors.As(err, &a), errors.As(cur, &b)
	switch {
	case !br:
		return false
	case !ar:
		return true
	case a.Oversize != b.Oversize:
		return a.Oversize
	}
	return a.RetryAfter > b.RetryAfter
}

// Ready is nil when every cluster's Limiter is ready; otherwise each
// unready cluster's error, naming the cluster, joined (errors.Is finds
// ErrAllocatorUnreachable or ErrDuplicateSpender in it). Every gateway
// sees the same lost cluster, so a load balancer that drains unready
// gateways drains them all: as with one allocator, whose loss makes every
// gateway unready while they admit by their fallback policy.
func (r *Router) Ready() error {
	var errs []error
	for i, l := range r.lims {
		if err := l.Ready(); err != nil {
			errs = append(errs, fmt.Errorf("cluster %q: %w", r.names[i], err))
		}
	}
	return errors.Join(errs...)
}

// Flush is Limiter.Flush on every cluster at once; it returns when all
// have answered, with the failures joined, each naming its cluster.
func (r *Router) Flush(ctx context.Context) error {
	return r.each(func(l *Limiter) error { return l.Flush(ctx) })
}

// Close closes every cluster's Limiter at once (Limiter.Close: each
// returns its unspent leases to its own cluster, retried until ctx ends),
// so an unreachable cluster does not hold back the others' returns. The
// failures are joined, each naming its cluster.
func (r *Router) Close(ctx context.Context) error {
	return r.each(func(l *Limiter) error { return l.Close(ctx) })
}

// Keys is the number of keys whose state the clusters' Limiters hold.
func (r *Router) Keys() int {
	n := 0
	for _, l := range r.lims {
		n += l.Keys()
	}
	return n
}

// each runs f on every cluster's Limiter in parallel and joins the
// errors, each naming its cluster.
func (r *Router) each(f func(*Limiter) error) error {
	errs := make([]error, len(r.lims))
	var wg sync.WaitGroup
	for i, l := range r.lims {
		wg.Go(func() {
			if err := f(l); err != nil {
				errs[i] = fmt.Errorf("cluster %q: %w", r.names[i], err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
