package allocator

import (
	"context"
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

func acquireKeysOf(req *leasev1.AcquireRequest) []ledger.AcquireKey {
	in := req.GetKeys()
	out := make([]ledger.AcquireKey, len(in))
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
	m.Requests, m.Tokens = a.Requests, a.Tokens
	return m
}

func (p *protoAlloc) dim(d ledger.DimSnapshot) *leasev1.DimSnapshot {
	m := &p.dims[0]
	p.dims = p.dims[1:]
	m.Limit, m.Remaining, m.ResetUs, m.SharedPpm = d.Limit, d.Remaining, us(d.Reset), d.Shared
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

func acquireResponseOf(r *ledger.AcquireReply) *leasev1.AcquireResponse {
	n := len(r.Keys)
	p := newProtoAlloc(4*n, n) // granted, returned, held, share_burst
	res := make([]leasev1.KeyGrant, n)
	ptrs := make([]*leasev1.KeyGrant, n)
	for i := range r.Keys {
		x := &r.Keys[i]
		g := &res[i]
		g.Status = statusOf(x.Status)
		g.Granted, g.Returned, g.Held = p.amount(x.Granted), p.amount(x.Returned), p.amount(x.Held)
		g.RetryAfterUs = us(x.RetryAfter)
		g.Snapshot = p.snapshot(x.Snapshot)
		g.ActiveSpenders = uint32(x.ActiveSpenders)
		if !x.Share.Zero() {
			g.Share = &leasev1.Share{RequestsPpm: x.Share.Requests, TokensPpm: x.Share.Tokens}
			g.ShareBurst = p.amount(x.ShareBurst)
		}
		if x.ShareFair != x.Share {
			g.ShareFair = &leasev1.Share{RequestsPpm: x.ShareFair.Requests, TokensPpm: x.ShareFair.Tokens}
		}
		ptrs[i] = g
	}
	return &leasev1.AcquireResponse{Keys: ptrs, LeaseTtlUs: us(r.LeaseTTL)}
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
