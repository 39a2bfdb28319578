package allocator

import (
	"sync"
	"time"

	"github.com/rationhq/ration"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// Conversions between the protocol messages and the ledger's types. Replies
// are built from one slice per message type, so a 64-key reply costs a
// handful of allocations, not hundreds.

func callerOf(c *leasev1.Caller) Caller {
	return Caller{SpenderID: c.GetSpenderId(), Epoch: c.GetEpoch(), Sequence: c.GetSequence()}
}

func amountOf(a *leasev1.Amount) ration.Amount {
	return ration.Amount{Requests: a.GetRequests(), Tokens: a.GetTokens()}
}

func limitsOf(l *leasev1.Limits) ration.Limits {
	return ration.Limits{RPM: l.GetRpm(), TPM: l.GetTpm(), BurstRequests: l.GetBurstRequests(), BurstTokens: l.GetBurstTokens()}
}

// us converts d to whole microseconds, rounded up; a negative d is 0. It
// cannot overflow: a wait of years (a key deep in debt, or bucket.InfDuration)
// stays a large positive number.
func us(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	q := d / time.Microsecond
	if d%time.Microsecond != 0 {
		q++
	}
	return int64(q)
}

// acquireKeysOf converts req's keys into a slice from pool (the ledger
// keeps nothing of them once a call returns); release it with
// putAcquireKeys when done.
func acquireKeysOf(pool *sync.Pool, req *leasev1.AcquireRequest) *[]AcquireKey {
	in := req.GetKeys()
	p, _ := pool.Get().(*[]AcquireKey)
	if p == nil {
		p = new([]AcquireKey)
	}
	if cap(*p) < len(in) {
		*p = make([]AcquireKey, len(in))
	}
	*p = (*p)[:len(in)]
	out := *p
	for i, k := range in {
		// Field by field: a whole-struct store (it holds a string) is a
		// typed copy that runs the GC's bulk write barrier while marking.
		o := &out[i]
		o.Key = k.GetKey()
		o.Limits = limitsOf(k.GetLimits())
		o.Want, o.Need, o.SpendRate = amountOf(k.GetWant()), amountOf(k.GetNeed()), amountOf(k.GetSpendRate())
		o.Returned, o.Held, o.Debt = amountOf(k.GetReturned()), amountOf(k.GetHeld()), amountOf(k.GetDebt())
	}
	return p
}

func putAcquireKeys(pool *sync.Pool, p *[]AcquireKey) {
	for i := range *p {
		(*p)[i].Key = "" // drop the request's strings; the rest is overwritten
	}
	pool.Put(p)
}

func reserveKeysOf(req *leasev1.ReserveAheadRequest) []ReserveKey {
	in := req.GetKeys()
	out := make([]ReserveKey, len(in))
	for i, k := range in {
		w := k.GetMaxWaitUs()
		maxWait := time.Duration(w) * time.Microsecond
		if w < 0 || w > int64(ration.MaxWait/time.Microsecond) {
			maxWait = -1 // out of range; validation names the field
			if w > 0 {
				maxWait = ration.MaxWait + time.Microsecond
			}
		}
		out[i] = ReserveKey{Key: k.GetKey(), Limits: limitsOf(k.GetLimits()), Cost: amountOf(k.GetCost()), MaxWait: maxWait}
	}
	return out
}

func releaseKeysOf(req *leasev1.ReleaseRequest) []ReleaseKey {
	in := req.GetKeys()
	out := make([]ReleaseKey, len(in))
	for i, k := range in {
		out[i] = ReleaseKey{Key: k.GetKey(), Limits: limitsOf(k.GetLimits()), Returned: amountOf(k.GetReturned()), Debt: amountOf(k.GetDebt())}
	}
	return out
}

// protoAlloc hands out proto messages from slices allocated once per reply.
type protoAlloc struct {
	amounts []leasev1.Amount
	snaps   []leasev1.Snapshot
	dims    []leasev1.DimSnapshot
}

func newProtoAlloc(amounts, snaps int) *protoAlloc {
	return &protoAlloc{
		amounts: make([]leasev1.Amount, amounts),
		snaps:   make([]leasev1.Snapshot, snaps),
		dims:    make([]leasev1.DimSnapshot, 2*snaps),
	}
}

func (p *protoAlloc) amount(a ration.Amount) *leasev1.Amount {
	m := &p.amounts[0]
	p.amounts = p.amounts[1:]
	m.Requests, m.Tokens = a.Requests, a.Tokens
	return m
}

func (p *protoAlloc) dim(d DimSnapshot) *leasev1.DimSnapshot {
	m := &p.dims[0]
	p.dims = p.dims[1:]
	m.Limit, m.Remaining, m.ResetUs = d.Limit, d.Remaining, us(d.Reset)
	return m
}

func (p *protoAlloc) snapshot(s Snapshot) *leasev1.Snapshot {
	m := &p.snaps[0]
	p.snaps = p.snaps[1:]
	m.Requests, m.Tokens = p.dim(s.Requests), p.dim(s.Tokens)
	return m
}

func statusOf(s Status) leasev1.GrantStatus {
	switch s {
	case StatusOK:
		return leasev1.GrantStatus_GRANT_STATUS_OK
	case StatusNotCovered:
		return leasev1.GrantStatus_GRANT_STATUS_NOT_COVERED
	case StatusTooLarge:
		return leasev1.GrantStatus_GRANT_STATUS_TOO_LARGE
	case StatusTooLate:
		return leasev1.GrantStatus_GRANT_STATUS_TOO_LATE
	}
	return leasev1.GrantStatus_GRANT_STATUS_UNSPECIFIED
}

// grantMsgs is one key's reply messages, allocated together: a 64-key
// reply is two allocations (the blocks and the pointer slice).
type grantMsgs struct {
	grant   leasev1.KeyGrant
	amounts [3]leasev1.Amount
	snap    leasev1.Snapshot
	dims    [2]leasev1.DimSnapshot
}

// link points the block's messages at each other. A pooled block already
// does, and then link stores nothing: a pointer stored into the heap passes
// the GC's write barrier while a collection is marking, and a 64-key reply
// has 448 of them.
func (m *grantMsgs) link() {
	g := &m.grant
	if g.Granted == &m.amounts[0] && g.Returned == &m.amounts[1] && g.Held == &m.amounts[2] &&
		g.Snapshot == &m.snap && m.snap.Requests == &m.dims[0] && m.snap.Tokens == &m.dims[1] {
		return
	}
	g.Granted, g.Returned, g.Held = &m.amounts[0], &m.amounts[1], &m.amounts[2]
	m.snap.Requests, m.snap.Tokens = &m.dims[0], &m.dims[1]
	g.Snapshot = &m.snap
}

// acquireResponseOf returns r as a proto reply. With a holder (the call
// came through Mount), the messages come from a pool and the holder returns
// them once the reply is written; otherwise they are allocated.
func acquireResponseOf(r *AcquireReply, hd *replyHolder) *leasev1.AcquireResponse {
	n := len(r.Keys)
	var b *acquireBuf
	if hd != nil && n <= maxPooledKeys {
		if b = getAcquireBuf(n); !hd.register(b) {
			putAcquireBuf(b) // unused: the holder is closed or taken
			b = nil
		}
	}
	if b == nil {
		b = &acquireBuf{blocks: make([]grantMsgs, n), ptrs: make([]*leasev1.KeyGrant, n)}
	}
	blocks, ptrs := b.blocks, b.ptrs
	for i := range r.Keys {
		x := &r.Keys[i]
		m := &blocks[i]
		g := &m.grant
		// Every field of every message is set (a pooled block holds the
		// previous reply's values).
		g.Status = statusOf(x.Status)
		m.amounts[0].Requests, m.amounts[0].Tokens = x.Granted.Requests, x.Granted.Tokens
		m.amounts[1].Requests, m.amounts[1].Tokens = x.Returned.Requests, x.Returned.Tokens
		m.amounts[2].Requests, m.amounts[2].Tokens = x.Held.Requests, x.Held.Tokens
		g.RetryAfterUs = us(x.RetryAfter)
		s := &x.Snapshot
		m.dims[0].Limit, m.dims[0].Remaining, m.dims[0].ResetUs = s.Requests.Limit, s.Requests.Remaining, us(s.Requests.Reset)
		m.dims[1].Limit, m.dims[1].Remaining, m.dims[1].ResetUs = s.Tokens.Limit, s.Tokens.Remaining, us(s.Tokens.Reset)
		g.ActiveSpenders = uint32(x.ActiveSpenders)
		m.link()
		if ptrs[i] != g {
			ptrs[i] = g
		}
	}
	b.resp.Keys, b.resp.LeaseTtlUs = ptrs, us(r.LeaseTTL)
	return &b.resp
}

func reserveResponseOf(r *ReserveReply) *leasev1.ReserveAheadResponse {
	n := len(r.Keys)
	p := newProtoAlloc(n, n)
	res := make([]leasev1.KeyReservation, n)
	ptrs := make([]*leasev1.KeyReservation, n)
	for i := range r.Keys {
		x := &r.Keys[i]
		g := &res[i]
		g.Status = statusOf(x.Status)
		g.WaitUs = us(x.Wait)
		g.Held = p.amount(x.Held)
		g.Snapshot = p.snapshot(x.Snapshot)
		g.ActiveSpenders = uint32(x.ActiveSpenders)
		ptrs[i] = g
	}
	return &leasev1.ReserveAheadResponse{Keys: ptrs, LeaseTtlUs: us(r.LeaseTTL)}
}

func releaseResponseOf(r *ReleaseReply) *leasev1.ReleaseResponse {
	p := newProtoAlloc(len(r.Returned), 0)
	ptrs := make([]*leasev1.Amount, len(r.Returned))
	for i, a := range r.Returned {
		ptrs[i] = p.amount(a)
	}
	return &leasev1.ReleaseResponse{Returned: ptrs}
}
