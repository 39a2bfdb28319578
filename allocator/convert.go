package allocator

import (
	"context"
	"slices"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/leasewire"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// Conversions between the protocol messages and the ledger's types. Replies
// are built from one slice per message type, so a 64-key reply costs a
// handful of allocations, not hundreds.

// callerOf is a call's caller, with the credential its context carries.
func callerOf(ctx context.Context, c *leasev1.Caller) ledger.Caller {
	return ledger.Caller{SpenderID: c.GetSpenderId(), Epoch: c.GetEpoch(), Sequence: c.GetSequence(), Credential: credentialOf(ctx)}
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

// acquireKeysOf converts req's keys into buf, reallocated if too small.
func acquireKeysOf(buf []ledger.AcquireKey, req *leasev1.AcquireRequest) []ledger.AcquireKey {
	in := req.GetKeys()
	out := slices.Grow(buf[:0], len(in))[:len(in)]
	for i, k := range in {
		out[i] = ledger.AcquireKey{Key: k.GetKey(), Limits: leasewire.LimitsOf(k.GetLimits()),
			Want: leasewire.AmountOf(k.GetWant()), Need: leasewire.AmountOf(k.GetNeed()), SpendRate: leasewire.AmountOf(k.GetSpendRate()),
			Returned: leasewire.AmountOf(k.GetReturned()), Held: leasewire.AmountOf(k.GetHeld()), Debt: leasewire.AmountOf(k.GetDebt()),
			Demand: leasewire.AmountOf(k.GetDemand())}
	}
	return out
}

func reserveKeysOf(req *leasev1.ReserveAheadRequest) []ledger.ReserveKey {
	in := req.GetKeys()
	out := make([]ledger.ReserveKey, len(in))
	for i, k := range in {
		w := k.GetMaxWaitUs()
		maxWait := time.Duration(w) * time.Microsecond
		if w < 0 || w > int64(ration.MaxWait/time.Microsecond) {
			maxWait = -1 // out of range; validation names the field
			if w > 0 {
				maxWait = ration.MaxWait + time.Microsecond
			}
		}
		out[i] = ledger.ReserveKey{Key: k.GetKey(), Limits: leasewire.LimitsOf(k.GetLimits()), Cost: leasewire.AmountOf(k.GetCost()), MaxWait: maxWait}
	}
	return out
}

func releaseKeysOf(req *leasev1.ReleaseRequest) []ledger.ReleaseKey {
	in := req.GetKeys()
	out := make([]ledger.ReleaseKey, len(in))
	for i, k := range in {
		out[i] = ledger.ReleaseKey{Key: k.GetKey(), Limits: leasewire.LimitsOf(k.GetLimits()), Returned: leasewire.AmountOf(k.GetReturned()), Debt: leasewire.AmountOf(k.GetDebt())}
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
	setAmount(m, a)
	return m
}

func (p *protoAlloc) dim(d ledger.DimSnapshot) *leasev1.DimSnapshot {
	m := &p.dims[0]
	p.dims = p.dims[1:]
	setDim(m, d)
	return m
}

func (p *protoAlloc) snapshot(s ledger.Snapshot) *leasev1.Snapshot {
	m := &p.snaps[0]
	p.snaps = p.snaps[1:]
	m.Requests, m.Tokens = p.dim(s.Requests), p.dim(s.Tokens)
	return m
}

func statusOf(s ledger.Status) leasev1.GrantStatus {
	switch s {
	case ledger.StatusOK:
		return leasev1.GrantStatus_GRANT_STATUS_OK
	case ledger.StatusNotCovered:
		return leasev1.GrantStatus_GRANT_STATUS_NOT_COVERED
	case ledger.StatusTooLarge:
		return leasev1.GrantStatus_GRANT_STATUS_TOO_LARGE
	case ledger.StatusTooLate:
		return leasev1.GrantStatus_GRANT_STATUS_TOO_LATE
	}
	return leasev1.GrantStatus_GRANT_STATUS_UNSPECIFIED
}

// acquireBuf is one Acquire reply's proto messages: a block of messages
// per key, so that a whole reply is three allocations, or none when the
// buffer comes back from the Service's pool (see replyHolder).
type acquireBuf struct {
	resp   leasev1.AcquireResponse
	ptrs   []*leasev1.KeyGrant
	blocks []grantMsgs
}

// grantMsgs is one key's reply messages.
type grantMsgs struct {
	grant            leasev1.KeyGrant
	amounts          [4]leasev1.Amount // granted, returned, held, share_burst
	snap             leasev1.Snapshot
	dims             [2]leasev1.DimSnapshot
	share, shareFair leasev1.Share
}

func newAcquireBuf(n int) *acquireBuf {
	return &acquireBuf{ptrs: make([]*leasev1.KeyGrant, n), blocks: make([]grantMsgs, n)}
}

// resize makes b hold n keys' messages.
func (b *acquireBuf) resize(n int) {
	if cap(b.blocks) < n {
		*b = *newAcquireBuf(n)
	}
	b.ptrs, b.blocks = b.ptrs[:n], b.blocks[:n]
}

// setPtr stores v in *p unless it is there already: a buffer from the pool
// keeps its links, and a pointer stored into the heap while the GC marks
// passes its write barrier (a 64-key reply links some 450).
func setPtr[T any](p **T, v *T) {
	if *p != v {
		*p = v
	}
}

// acquireResponseOf fills b with r as a proto reply and returns it. Every
// field of every message is set: a pooled b holds an earlier reply.
func acquireResponseOf(r *ledger.AcquireReply, b *acquireBuf) *leasev1.AcquireResponse {
	b.resize(len(r.Keys))
	for i := range r.Keys {
		x := &r.Keys[i]
		m := &b.blocks[i]
		g := &m.grant
		g.Status = statusOf(x.Status)
		setAmount(&m.amounts[0], x.Granted)
		setAmount(&m.amounts[1], x.Returned)
		setAmount(&m.amounts[2], x.Held)
		setPtr(&g.Granted, &m.amounts[0])
		setPtr(&g.Returned, &m.amounts[1])
		setPtr(&g.Held, &m.amounts[2])
		g.RetryAfterUs = us(x.RetryAfter)
		setDim(&m.dims[0], x.Snapshot.Requests)
		setDim(&m.dims[1], x.Snapshot.Tokens)
		setPtr(&m.snap.Requests, &m.dims[0])
		setPtr(&m.snap.Tokens, &m.dims[1])
		setPtr(&g.Snapshot, &m.snap)
		g.ActiveSpenders = uint32(x.ActiveSpenders)
		g.Share, g.ShareBurst, g.ShareFair = nil, nil, nil
		if !x.Share.Zero() {
			m.share.RequestsPpm, m.share.TokensPpm = x.Share.Requests, x.Share.Tokens
			setAmount(&m.amounts[3], x.ShareBurst)
			g.Share, g.ShareBurst = &m.share, &m.amounts[3]
		}
		if x.ShareFair != x.Share {
			m.shareFair.RequestsPpm, m.shareFair.TokensPpm = x.ShareFair.Requests, x.ShareFair.Tokens
			g.ShareFair = &m.shareFair
		}
		setPtr(&b.ptrs[i], g)
	}
	b.resp.Keys, b.resp.LeaseTtlUs = b.ptrs, us(r.LeaseTTL)
	return &b.resp
}

func setAmount(m *leasev1.Amount, a ration.Amount) { m.Requests, m.Tokens = a.Requests, a.Tokens }

func setDim(m *leasev1.DimSnapshot, d ledger.DimSnapshot) {
	m.Limit, m.Remaining, m.ResetUs, m.SharedPpm = d.Limit, d.Remaining, us(d.Reset), d.Shared
}

func reserveResponseOf(r *ledger.ReserveReply) *leasev1.ReserveAheadResponse {
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

func releaseResponseOf(r *ledger.ReleaseReply) *leasev1.ReleaseResponse {
	p := newProtoAlloc(len(r.Returned), 0)
	ptrs := make([]*leasev1.Amount, len(r.Returned))
	for i, a := range r.Returned {
		ptrs[i] = p.amount(a)
	}
	return &leasev1.ReleaseResponse{Returned: ptrs}
}
