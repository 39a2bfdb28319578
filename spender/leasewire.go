package spender

import (
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender/internal/lease"
)

// The lease protocol's messages and the lease core's types, each way.
// The core speaks only its own types; the driver converts at the edge.

// leasedStatus is the Status of a key with limits lim and req requests and
// tok tokens remaining: each limited dimension's capacity, what remains,
// and how long its global bucket takes to refill from there.
func leasedStatus(lim ration.Limits, req, tok int64) Status {
	windowUs := float64(lim.Period() / time.Microsecond)
	dim := func(rate, limit, remaining int64) (int64, int64, time.Duration) {
		if remaining >= limit {
			return limit, remaining, 0
		}
		return limit, remaining, time.Duration(float64(limit-remaining)*windowUs/float64(rate)) * time.Microsecond
	}
	var s Status
	capacity := lim.Capacity()
	if lim.RPM > 0 {
		s.LimitRequests, s.RemainingRequests, s.ResetRequests = dim(lim.RPM, capacity.Requests, req)
	}
	if lim.TPM > 0 {
		s.LimitTokens, s.RemainingTokens, s.ResetTokens = dim(lim.TPM, capacity.Tokens, tok)
	}
	return s
}

// toAmount is c on the wire, clamped to the protocol's range: amounts
// above it saturate rather than make the allocator refuse the whole call.
func toAmount(c ration.Amount) *leasev1.Amount {
	c = c.Clamp()
	return &leasev1.Amount{Requests: c.Requests, Tokens: c.Tokens}
}

func fromAmount(a *leasev1.Amount) ration.Amount {
	return ration.Amount{Requests: a.GetRequests(), Tokens: a.GetTokens()}
}

func fromLimits(l *leasev1.Limits) ration.Limits {
	return ration.Limits{RPM: l.GetRpm(), TPM: l.GetTpm(), BurstRequests: l.GetBurstRequests(), BurstTokens: l.GetBurstTokens(),
		Window: time.Duration(l.GetWindowSeconds()) * time.Second}
}

func toLimits(l ration.Limits) *leasev1.Limits {
	return &leasev1.Limits{Rpm: l.RPM, Tpm: l.TPM, BurstRequests: l.BurstRequests, BurstTokens: l.BurstTokens,
		WindowSeconds: uint32(l.Window / time.Second)}
}

// toKeyAcquire is an Acquire entry on the wire (the core clamps its
// amounts to the protocol's range).
func toKeyAcquire(en *lease.Entry) *leasev1.KeyAcquire {
	return &leasev1.KeyAcquire{
		Key: en.Key, Limits: toLimits(en.Limits),
		Want: toAmount(en.Want), Need: toAmount(en.Need), SpendRate: toAmount(en.SpendRate),
		Returned: toAmount(en.Returned), Held: toAmount(en.Held), Debt: toAmount(en.Debt), Demand: toAmount(en.Demand),
	}
}

// fromKeyGrant is the allocator's answer to one Acquire entry.
func fromKeyGrant(g *leasev1.KeyGrant) lease.Grant {
	out := lease.Grant{
		Granted:  fromAmount(g.GetGranted()),
		Held:     fromAmount(g.GetHeld()),
		HasHeld:  g.GetHeld() != nil,
		Share:    wireShare(g.GetShare()),
		Burst:    fromAmount(g.GetShareBurst()),
		Fair:     wireShare(g.GetShareFair()),
		HasFair:  g.GetShareFair() != nil,
		Snapshot: fromSnapshot(g.GetSnapshot()),
		Active:   g.GetActiveSpenders(),
		Returned: fromAmount(g.GetReturned()),
	}
	switch g.GetStatus() {
	case leasev1.GrantStatus_GRANT_STATUS_OK:
		out.Status = lease.GrantOK
	case leasev1.GrantStatus_GRANT_STATUS_NOT_COVERED:
		out.Status = lease.GrantNotCovered
		out.RetryAfter = wireDuration(g.GetRetryAfterUs())
	case leasev1.GrantStatus_GRANT_STATUS_TOO_LARGE:
		out.Status = lease.GrantTooLarge
	}
	return out
}

// fromKeyReservation is the allocator's answer to one ReserveAhead entry.
func fromKeyReservation(r *leasev1.KeyReservation) lease.Reserved {
	out := lease.Reserved{Wait: time.Duration(r.GetWaitUs()) * time.Microsecond, Snapshot: fromSnapshot(r.GetSnapshot())}
	switch r.GetStatus() {
	case leasev1.GrantStatus_GRANT_STATUS_OK:
		out.Status = lease.GrantOK
	case leasev1.GrantStatus_GRANT_STATUS_TOO_LARGE:
		out.Status = lease.GrantTooLarge
	case leasev1.GrantStatus_GRANT_STATUS_NOT_COVERED:
		out.Status = lease.GrantNotCovered
	case leasev1.GrantStatus_GRANT_STATUS_TOO_LATE:
		out.Status = lease.GrantTooLate
	}
	return out
}

// fromSnapshot is a key's global buckets as an answer reported them (nil:
// not reported).
func fromSnapshot(sn *leasev1.Snapshot) *lease.Snapshot {
	if sn == nil {
		return nil
	}
	return &lease.Snapshot{
		Remaining: ration.Amount{Requests: sn.GetRequests().GetRemaining(), Tokens: sn.GetTokens().GetRemaining()},
		Shared:    shareOf(sn.GetRequests().GetSharedPpm(), sn.GetTokens().GetSharedPpm()),
	}
}

// wireShare is a share on the wire, clamped to the whole rate.
func wireShare(s *leasev1.Share) ration.Share {
	return shareOf(s.GetRequestsPpm(), s.GetTokensPpm())
}

func shareOf(req, tok uint32) ration.Share {
	return ration.Share{Requests: min(req, ration.ShareUnit), Tokens: min(tok, ration.ShareUnit)}
}

// wireDuration converts a wait in microseconds from the allocator to a
// Duration: saturating rather than overflowing, and at least 1ms, so that a
// malformed (negative or zero) wait cannot make the key ask again in a loop.
func wireDuration(us int64) time.Duration {
	if us <= 0 {
		return time.Millisecond
	}
	if us > int64(bucket.InfDuration/time.Microsecond) {
		return bucket.InfDuration
	}
	return max(time.Millisecond, time.Duration(us)*time.Microsecond)
}
